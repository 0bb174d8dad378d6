#pragma once
// Private: how an all_gather or reduce_scatter whose ranks hold different element counts (FSDP's
// flat buffers: the last ranks' shards are shorter) runs as ONE even collective over a staging
// buffer of size() * max(counts) elements, in which rank r's part sits at r * max(counts). The
// copies into and out of the staging buffer are planned here, in plain C++, so the layout is
// tested on the CPU (tests/collectives/padded_exchange_test.cc); a backend executes them with
// its device's copies (NCCL: cudaMemcpyAsync on its stream).
//
// all_gather:     copy `input` into staging[rank * max]; all_gather(staging + rank * max ->
//                 staging, max each) in place; then `unpack` (staging -> output).
// reduce_scatter: `pack` (input -> staging); reduce_scatter(staging -> staging + rank * max,
//                 max each) in place; then copy staging[rank * max, + counts[rank]) to `output`.
// The padding between parts is never written: the gather drops it, and the reduction is
// element by element, so whatever it holds reaches only padding.

#include <cstdint>
#include <span>
#include <vector>

namespace tessel::internal {

// Copy `count` elements from element `from` of one buffer to element `to` of another.
struct ElementCopy {
  int64_t from = 0, to = 0, count = 0;
  bool operator==(const ElementCopy&) const = default;
};

struct PaddedExchange {
  int64_t part = 0;  // max(counts): elements per rank in the even collective
  // Where rank r's elements start in the packed (unpadded) layout: counts[0] + ... + counts[r-1].
  std::vector<int64_t> offsets;
  // packed -> staging (reduce_scatter's input). Ranks whose parts are full (count == part) and
  // adjacent form one copy; empty parts make none.
  std::vector<ElementCopy> pack;
  // staging -> packed (all_gather's output): `pack` with from and to swapped.
  std::vector<ElementCopy> unpack;
  int64_t staging_elements() const { return part * static_cast<int64_t>(offsets.size()); }
};

// The plan for `counts` (one per rank, each >= 0). Throws InvalidArgument for an empty or
// negative count list.
PaddedExchange plan_padded_exchange(std::span<const int64_t> counts);

// True when every count is the same (the collective needs no staging).
bool counts_even(std::span<const int64_t> counts);

}  // namespace tessel::internal
