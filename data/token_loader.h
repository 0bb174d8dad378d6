#pragma once
// A distributed, resumable loader of training sequences from token shards (token_shard.h):
// every data-parallel rank reads its own, disjoint rows of each global batch, in an order fixed
// by the shards and the seed, and the loader's position is one small global state that a
// checkpoint saves and that any data-parallel degree can resume from. docs/data.md, "Loader".
//
//   data::TokenLoader loader(data::expand_shard_glob("shards/train_*.bin"),
//                            {.seq_len = 1024, .global_batch = 32, .dp_rank = r, .dp_size = 8,
//                             .seed = 1, .eot_token = 50256});
//   data::TokenBatch batch = loader.next();          // this rank's 4 rows of the global batch
//   Tensor x = batch.inputs(), y = batch.targets();  // (4, 1024) int64 each
//   checkpoint_metadata["data.loader"] = loader.state().to_json();

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/data/token_shard.h"
#include "tessel/tensor/tensor.h"

namespace tessel::data {

// The shard files matching a glob pattern (glob(3): *, ?, [...]), sorted by name. Throws
// InvalidArgument naming the pattern when nothing matches; a plain path is returned as is
// (opening it later names it if it is missing).
std::vector<std::filesystem::path> expand_shard_glob(const std::string& pattern);

// Where the global token stream is. The same on every rank: a position counts sequences of
// the whole job, not of one rank, so a job resumed on another data-parallel degree continues
// it. `sequences` and `seq_len` describe the data it was made on and are checked on restore.
struct TokenLoaderState {
  uint64_t epoch = 0;      // full passes over the shards done
  uint64_t position = 0;   // sequences of this epoch's order already handed out (global)
  uint64_t seed = 0;       // the shuffle's seed
  uint64_t sequences = 0;  // sequences in one epoch over these shards
  int64_t seq_len = 0;     // tokens per input row

  // {"epoch":..,"position":..,"seed":..,"sequences":..,"seq_len":..}; from_json throws
  // InvalidArgument naming the field that is missing or not a number.
  std::string to_json() const;
  static TokenLoaderState from_json(std::string_view json);
  bool operator==(const TokenLoaderState&) const = default;
};

struct TokenLoaderOptions {
  int64_t seq_len = 1024;    // T: each row is T inputs and the T targets shifted by one
  int64_t global_batch = 8;  // rows per step over all data-parallel ranks (a multiple of dp_size)
  int64_t dp_rank = 0;       // this rank's index among the data-parallel ranks
  int64_t dp_size = 1;       // data-parallel ranks (the TP ranks of one dp group share an index)
  bool shuffle = true;       // a new order of the sequences every epoch, from seed and epoch
  uint64_t seed = 0;         // the shuffle's seed
  std::optional<uint32_t> eot_token;  // the document separator; enables document_ids()
};

// One rank's rows of a global batch: `rows` windows of seq_len + 1 tokens each.
struct TokenBatch {
  std::vector<uint32_t> tokens;  // rows x (seq_len + 1), row-major
  int64_t rows = 0;
  int64_t seq_len = 0;
  std::optional<uint32_t> eot_token;
  uint64_t epoch = 0;           // the epoch the batch was read in
  uint64_t first_sequence = 0;  // the global position of the batch's first row (all ranks')

  Tensor inputs() const;   // (rows, seq_len) int64: tokens [0, T) of each row
  Tensor targets() const;  // (rows, seq_len) int64: tokens [1, T] of each row
  // (rows, seq_len) int64: the document each input position belongs to, counted from 0 in its
  // row; a position after an eot token starts the next document (the eot token ends its own),
  // so attention masked to equal ids never crosses a document boundary. Throws
  // InvalidArgument when the loader has no eot_token.
  Tensor document_ids() const;
};

// Cuts every shard into sequences of seq_len + 1 tokens (the window of sequence i of a shard
// starts at token i * seq_len, so consecutive windows share one token, as llm.c reads; windows
// never span two shards; a shard's last seq_len or fewer tokens are left out). An epoch is all
// sequences of all shards, in shard order or shuffled by (seed, epoch); global batch k of the
// epoch is its sequences [k * global_batch, (k + 1) * global_batch), and data-parallel rank r
// takes the r-th of its dp_size equal parts. The sequences that do not fill a last global
// batch are skipped, and the next epoch starts. So over an epoch every sequence that the
// batches cover is read exactly once by exactly one rank, whatever dp_size is.
//
// Opening maps every shard (TokenShard: errors name the file and the offset). Not
// thread-safe: one thread calls next(). Owns the mappings.
class TokenLoader {
 public:
  // Throws InvalidArgument for no shards, options that do not fit (seq_len < 1, global_batch
  // not a multiple of dp_size, dp_rank outside [0, dp_size)), or shards too short to fill one
  // global batch; IoError / InvalidArgument from TokenShard naming a missing or corrupt file.
  TokenLoader(const std::vector<std::filesystem::path>& shards, const TokenLoaderOptions& options);

  // This rank's rows of the next global batch; the position moves on by global_batch on every
  // rank. Blocking file reads (page faults of the mapping) only.
  TokenBatch next();

  TokenLoaderState state() const;
  // Continues from `state` (saved by a loader over the same shards and seq_len, any dp_size or
  // global_batch). Throws InvalidArgument when the shards or seq_len differ from the state's.
  void restore(const TokenLoaderState& state);

  uint64_t sequences_per_epoch() const { return windows_.size(); }
  uint64_t batches_per_epoch() const;
  const TokenLoaderOptions& options() const { return options_; }

 private:
  void start_epoch(uint64_t epoch);

  TokenLoaderOptions options_;
  std::vector<TokenShard> shards_;
  struct Window {
    uint32_t shard;
    uint64_t start;  // first token
  };
  std::vector<Window> windows_;  // every sequence of an epoch, in shard order
  std::vector<uint64_t> order_;  // this epoch's order of windows_ (empty: unshuffled)
  uint64_t epoch_ = 0;
  uint64_t position_ = 0;
};

}  // namespace tessel::data
