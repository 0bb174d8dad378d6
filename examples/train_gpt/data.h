// What train_gpt trains on: a text file whose bytes are the tokens, or token shards read by a
// data::TokenLoader (docs/data.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flags.h"
#include "tessel/data/token_loader.h"
#include "tessel/tensor/tensor.h"

namespace tessel::train_gpt {

// Random windows of `text`: tokens (B, T) and the next byte of each as targets. Every rank
// draws the same global batch and keeps its rows.
struct Batcher {
  const std::string& text;
  std::mt19937_64 rng;

  std::pair<Tensor, Tensor> next(int64_t B, int64_t T);
};

// A stream of batches (x, y): each call gives the next.
using BatchStream = std::function<std::pair<Tensor, Tensor>()>;

// Whether `path` names token shards (tessel-tokenize's or llm.c's) rather than a text file: a
// glob pattern, or a file that starts with a shard magic.
bool names_token_shards(const std::string& path);

// What the model trains on. A text file (--data, the bundled corpus by default): bytes are the
// tokens, batches are random windows, every rank draws the same global batch from --seed and
// keeps its rows, the first 90 % train and the last 10 % validate. Token shards (--data GLOB):
// a data::TokenLoader in which each data-parallel rank reads only its rows of every global batch
// (the ranks of a tp group the same ones), validated on --val-data (or the training shards'
// first batches); its global position goes into the checkpoint, so a resumed job on any number
// of ranks continues the same token stream (docs/data.md, "Loader"). Not movable (the batcher
// refers to the text it holds).
class TrainingData {
 public:
  // This rank reads rows `part` of `parts` of every global batch of --batch sequences.
  TrainingData(const Flags& f, int64_t part, int64_t parts);
  TrainingData(const TrainingData&) = delete;
  TrainingData& operator=(const TrainingData&) = delete;

  int64_t vocab_size() const { return vocab_; }
  const std::string& description() const { return description_; }

  // This rank's rows (x, y) of the next global training batch, on the CPU.
  std::pair<Tensor, Tensor> next_train();

  // The same validation batches on every call: each step of the stream gives rows `part` of
  // `parts` of the next global batch of --batch sequences.
  BatchStream validation(int64_t part, int64_t parts, uint64_t seed) const;

  // The training position, in the checkpoint's metadata and back: the byte sampler's generator
  // or the loader's global state (JSON).
  void save(std::map<std::string, std::string>& metadata) const;
  void restore(const std::map<std::string, std::string>& metadata);

 private:
  std::pair<Tensor, Tensor> rows_of(std::pair<Tensor, Tensor> global, int64_t part,
                                    int64_t parts) const;

  const Flags& f_;
  int64_t part_, parts_;
  int64_t vocab_ = 256;
  std::string description_;
  std::string text_, train_text_, val_text_;
  std::optional<Batcher> batcher_;
  std::vector<std::filesystem::path> train_shards_, val_shards_;
  std::optional<data::TokenLoader> loader_;
};

}  // namespace tessel::train_gpt
