#include "tessel/parallel/cp/sequence_shard.h"

#include <algorithm>
#include <utility>

#include "tessel/base/error.h"
#include "tessel/tensor/ops.h"

namespace tessel::parallel {
namespace {

// Lengths of `parts` near-equal pieces of `total`: the first total % parts one longer.
std::vector<int64_t> split_lengths(int64_t total, int64_t parts) {
  std::vector<int64_t> lengths(static_cast<size_t>(parts), total / parts);
  for (int64_t i = 0; i < total % parts; ++i) ++lengths[static_cast<size_t>(i)];
  return lengths;
}

}  // namespace

int64_t CpLayout::local_len(int rank) const {
  int64_t n = 0;
  for (const CpSegment& s : ranks.at(static_cast<size_t>(rank))) n += s.length;
  return n;
}

CpLayout cp_layout_contiguous(int64_t seq_len, int cp) {
  TESSEL_CHECK(cp >= 1 && seq_len >= cp, InvalidArgument,
               "cp_layout_contiguous: sequence of {} tokens over cp = {}; expected cp >= 1 and "
               "at least one token per rank",
               seq_len, cp);
  CpLayout layout{seq_len, {}};
  int64_t start = 0;
  for (int64_t len : split_lengths(seq_len, cp)) {
    layout.ranks.push_back({CpSegment{start, len}});
    start += len;
  }
  return layout;
}

CpLayout cp_layout_load_balanced(int64_t seq_len, int cp) {
  TESSEL_CHECK(cp >= 1 && seq_len >= 2 * static_cast<int64_t>(cp), InvalidArgument,
               "cp_layout_load_balanced: sequence of {} tokens over cp = {}; expected cp >= 1 "
               "and at least 2 * cp = {} tokens",
               seq_len, cp, 2 * cp);
  const std::vector<int64_t> lengths = split_lengths(seq_len, 2 * cp);
  std::vector<CpSegment> chunks;
  int64_t start = 0;
  for (int64_t len : lengths) {
    chunks.push_back({start, len});
    start += len;
  }
  CpLayout layout{seq_len, {}};
  for (int r = 0; r < cp; ++r) {
    layout.ranks.push_back(
        {chunks[static_cast<size_t>(r)], chunks[static_cast<size_t>(2 * cp - 1 - r)]});
  }
  return layout;
}

Tensor cp_shard_sequence(const Tensor& t, const CpLayout& layout, int rank, int64_t dim) {
  TESSEL_CHECK(rank >= 0 && rank < layout.cp(), InvalidArgument,
               "cp_shard_sequence: rank {} not in a cp group of {}", rank, layout.cp());
  TESSEL_CHECK(t.size(dim) == layout.seq_len, InvalidArgument,
               "cp_shard_sequence: dim {} has {} tokens; the layout expects {}", dim, t.size(dim),
               layout.seq_len);
  std::vector<Tensor> parts;
  for (const CpSegment& s : layout.ranks[static_cast<size_t>(rank)]) {
    parts.push_back(narrow(t, dim, s.start, s.length));
  }
  return parts.size() == 1 ? contiguous(parts[0]) : cat(parts, dim);
}

Tensor cp_unshard_sequence(const std::vector<Tensor>& pieces, const CpLayout& layout, int64_t dim) {
  TESSEL_CHECK(static_cast<int>(pieces.size()) == layout.cp(), InvalidArgument,
               "cp_unshard_sequence: {} pieces for a cp group of {}", pieces.size(), layout.cp());
  // Every segment, keyed by its global start, as a view of its rank's piece.
  std::vector<std::pair<int64_t, Tensor>> segments;
  for (int r = 0; r < layout.cp(); ++r) {
    const Tensor& piece = pieces[static_cast<size_t>(r)];
    TESSEL_CHECK(piece.size(dim) == layout.local_len(r), InvalidArgument,
                 "cp_unshard_sequence: rank {}'s piece has {} tokens along dim {}; expected {}", r,
                 piece.size(dim), dim, layout.local_len(r));
    int64_t at = 0;
    for (const CpSegment& s : layout.ranks[static_cast<size_t>(r)]) {
      segments.emplace_back(s.start, narrow(piece, dim, at, s.length));
      at += s.length;
    }
  }
  std::sort(segments.begin(), segments.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Tensor> ordered;
  for (auto& [start, t] : segments) ordered.push_back(t);
  return cat(ordered, dim);
}

Tensor cp_global_positions(const CpLayout& layout, int rank) {
  std::vector<int64_t> positions;
  for (const CpSegment& s : layout.ranks.at(static_cast<size_t>(rank))) {
    for (int64_t i = 0; i < s.length; ++i) positions.push_back(s.start + i);
  }
  return from_vector<int64_t>(positions);
}

}  // namespace tessel::parallel
