// Reduce-scatter as pairwise exchanges, for groups whose ranks share a host: each rank receives
// the peers' pieces of its chunk (through shared memory where it can) and reduces them in rank
// order, so every rank gets the same bits; the own piece is read from the input.

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "tessel/collectives/gloo/internal/reduce_scatter.h"
#include "tessel/collectives/internal/reduce.h"
#include "tessel/tensor/ops.h"

namespace tessel::internal {
namespace {

// Rounds of a reduce-scatter exchange at most: with all_reduce's gather, phases 0 to 255.
constexpr int64_t kMaxRounds = 255;

}  // namespace

uint32_t reduce_scatter_exchange(PairwiseExchange& exchange, int rank, int size,
                                 const Tensor& flat_in, std::span<const int64_t> counts,
                                 const Tensor& out, ReduceOp op, uint64_t seq, Nanoseconds timeout,
                                 size_t scratch_bytes) {
  const int n = size, me = rank;
  const DType dtype = flat_in.dtype();
  const auto element = static_cast<int64_t>(dtype_size(dtype));
  const int64_t mine = counts[static_cast<size_t>(me)];
  const int64_t longest = *std::max_element(counts.begin(), counts.end());
  // Elements of each chunk per round: what fits the scratch, and few enough rounds that the
  // phases (all_reduce adds one) stay within a call id's 8 bits.
  const int64_t per_round =
      std::max<int64_t>({static_cast<int64_t>(scratch_bytes) / ((n - 1) * element),
                         (longest + kMaxRounds - 1) / kMaxRounds, 1});
  const auto rounds =
      static_cast<uint32_t>(std::max<int64_t>(1, (longest + per_round - 1) / per_round));
  Tensor pieces = empty({(n - 1) * std::min(mine, per_round)}, dtype);
  std::vector<int64_t> offsets;
  for (int64_t j = 0, at = 0; j < n; at += counts[static_cast<size_t>(j)], ++j) {
    offsets.push_back(at);
  }
  std::vector<uint8_t> own_copy;
  for (uint32_t round = 0; round < rounds; ++round) {
    const int64_t lo = static_cast<int64_t>(round) * per_round;
    auto piece_of = [&](int j) {  // [first, length) of chunk j in this round
      const int64_t c = counts[static_cast<size_t>(j)];
      const int64_t first = std::min(lo, c);
      return std::pair{first, std::min(lo + per_round, c) - first};
    };
    const auto [first, len] = piece_of(me);
    std::vector<Tensor> inputs, outputs;
    for (int j = 0, slot = 0; j < n; ++j) {
      const auto [f, l] = piece_of(j);
      const bool own = j == me;  // reduced straight from the input
      inputs.push_back(narrow(flat_in, 0, offsets[static_cast<size_t>(j)] + f, own ? 0 : l));
      outputs.push_back(narrow(pieces, 0, own ? 0 : slot++ * len, own ? 0 : len));
    }
    exchange.run(inputs, outputs, seq, timeout, round);
    if (len == 0) continue;
    // Rank order, a block at a time so the block stays in cache while every piece goes in.
    // The own piece is read from a copy when `out` is where it lies.
    const auto* own = static_cast<const uint8_t*>(flat_in.data_ptr()) +
                      (offsets[static_cast<size_t>(me)] + first) * element;
    const auto* peers = static_cast<const uint8_t*>(pieces.data_ptr());
    auto* result = static_cast<uint8_t*>(out.data_ptr()) + first * element;
    const bool in_place = result == own;
    constexpr int64_t kBlockBytes = 16 << 10;
    const int64_t block = kBlockBytes / element;
    if (in_place) own_copy.resize(kBlockBytes);
    for (int64_t b = 0; b < len; b += block) {
      const int64_t m = std::min(block, len - b);
      if (in_place) {
        std::memcpy(own_copy.data(), own + b * element, static_cast<size_t>(m * element));
      }
      auto piece = [&](int j) -> const void* {
        if (j == me) return in_place ? own_copy.data() : own + b * element;
        return peers + ((j < me ? j : j - 1) * len + b) * element;
      };
      uint8_t* o = result + b * element;
      reduce_pair(dtype, op, o, piece(0), piece(1), m);
      for (int j = 2; j < n; ++j) reduce_into(dtype, op, o, piece(j), m);
    }
  }
  return rounds;
}

}  // namespace tessel::internal
