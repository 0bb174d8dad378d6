#pragma once
// How a sequence is split over the ranks of a `cp` group: a contiguous split (rank r holds
// tokens [r·S/cp, (r+1)·S/cp)) or the load-balanced causal split (the sequence cut into 2·cp
// chunks; rank r holds chunks r and 2·cp−1−r, so every rank does the same causal work), and
// the helpers that apply the split to tokens, positions, targets or document ids and undo it.
//
//   CpLayout layout = cp_layout_load_balanced(/*seq_len=*/1024, /*cp=*/4);
//   Tensor local = cp_shard_sequence(tokens, layout, rank, /*dim=*/1);     // (B, 256)
//   Tensor pos = cp_global_positions(layout, rank);                       // i64 (256)
//   Tensor full = cp_unshard_sequence(pieces_of_every_rank, layout, 1);   // (B, 1024)

#include <cstdint>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::parallel {

// A contiguous run of global token positions [start, start + length).
struct CpSegment {
  int64_t start = 0;
  int64_t length = 0;
};

// Which global positions each rank of a `cp` group holds, in the order it holds them: rank r's
// local tokens are its segments concatenated. The segments of all ranks partition [0, seq_len).
// A plain value; thread-compatible.
struct CpLayout {
  int64_t seq_len = 0;
  std::vector<std::vector<CpSegment>> ranks;  // ranks[r]: rank r's segments

  int cp() const { return static_cast<int>(ranks.size()); }
  // Tokens rank r holds (the sum of its segment lengths).
  int64_t local_len(int rank) const;
};

// Rank r holds [r·S/cp, (r+1)·S/cp) (the first S % cp ranks one token more when S is not a
// multiple of cp). Throws InvalidArgument when cp < 1 or seq_len < cp.
CpLayout cp_layout_contiguous(int64_t seq_len, int cp);

// The sequence cut into 2·cp chunks (the first S % (2·cp) one token longer); rank r holds chunk r
// then chunk 2·cp−1−r. Under a causal mask every rank then sees the same number of visible
// blocks. Throws InvalidArgument when cp < 1 or seq_len < 2·cp.
CpLayout cp_layout_load_balanced(int64_t seq_len, int cp);

// Rank `rank`'s slice of `t` along `dim` (size seq_len there): its segments concatenated.
// Differentiable (narrow + cat). Throws InvalidArgument when t.size(dim) != layout.seq_len.
Tensor cp_shard_sequence(const Tensor& t, const CpLayout& layout, int rank, int64_t dim);

// Undoes cp_shard_sequence: pieces[r] is rank r's slice; returns the sequence in global order
// along `dim`. Differentiable. Throws InvalidArgument when a piece has the wrong length.
Tensor cp_unshard_sequence(const std::vector<Tensor>& pieces, const CpLayout& layout, int64_t dim);

// The global positions of rank `rank`'s tokens, in local order: i64, (local_len(rank)). Use for
// rotary or learned positions of the slice.
Tensor cp_global_positions(const CpLayout& layout, int rank);

}  // namespace tessel::parallel
