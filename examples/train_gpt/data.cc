#include "data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "tessel/base/error.h"
#include "tessel/data/token_shard.h"
#include "tessel/tensor/ops.h"

namespace tessel::train_gpt {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSEL_CHECK(in.good(), IoError, "cannot open corpus '{}'", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Entropy (nats) of the byte distribution: the loss of the best context-free model.
double unigram_entropy(const std::string& text) {
  std::vector<double> counts(256, 0.0);
  for (unsigned char c : text) counts[c] += 1;
  double h = 0;
  for (double n : counts) {
    if (n > 0) h -= n / text.size() * std::log(n / text.size());
  }
  return h;
}

}  // namespace

std::pair<Tensor, Tensor> Batcher::next(int64_t B, int64_t T) {
  std::vector<int64_t> x(B * T), y(B * T);
  std::uniform_int_distribution<size_t> start(0, text.size() - static_cast<size_t>(T) - 1);
  for (int64_t b = 0; b < B; ++b) {
    const size_t s = start(rng);
    for (int64_t t = 0; t < T; ++t) {
      x[b * T + t] = static_cast<unsigned char>(text[s + t]);
      y[b * T + t] = static_cast<unsigned char>(text[s + t + 1]);
    }
  }
  return {from_vector<int64_t>(x, {B, T}), from_vector<int64_t>(y, {B, T})};
}

bool names_token_shards(const std::string& path) {
  if (path.find_first_of("*?[") != std::string::npos) return true;
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  in.read(head, sizeof head);
  int32_t magic = 0;
  std::memcpy(&magic, head, sizeof magic);
  return std::equal(head, head + 8, data::kShardMagic) || magic == data::kLlmcMagicGpt2 ||
         magic == data::kLlmcMagicLlama3;
}

TrainingData::TrainingData(const Flags& f, int64_t part, int64_t parts)
    : f_(f), part_(part), parts_(parts) {
  if (!names_token_shards(f.data)) {
    text_ = read_file(f.data);
    TESSEL_CHECK(text_.size() > static_cast<size_t>(10 * (f.seq + 1)), InvalidArgument,
                 "corpus '{}' has {} bytes, too few for sequences of {}", f.data, text_.size(),
                 f.seq);
    const size_t split = text_.size() * 9 / 10;
    train_text_ = text_.substr(0, split);
    val_text_ = text_.substr(split);
    batcher_.emplace(Batcher{train_text_, std::mt19937_64(f.seed)});
    description_ = fmt::format(
        "corpus {}: {} bytes ({} train / {} val), unigram entropy {:.3f} nats/byte", f.data,
        text_.size(), train_text_.size(), val_text_.size(), unigram_entropy(text_));
    return;
  }
  train_shards_ = data::expand_shard_glob(f.data);
  val_shards_ = f.val_data.empty() ? train_shards_ : data::expand_shard_glob(f.val_data);
  loader_.emplace(train_shards_, data::TokenLoaderOptions{.seq_len = f.seq,
                                                          .global_batch = f.batch,
                                                          .dp_rank = part_,
                                                          .dp_size = parts_,
                                                          .seed = f.seed});
  // The vocabulary: the largest the shards' headers give, else the largest token + 1.
  uint64_t tokens = 0;
  for (const auto& path : train_shards_) {
    const data::TokenShard shard(path);
    tokens += shard.size();
    uint32_t v = shard.vocab_size();
    if (v == 0) {
      for (size_t i = 0; i < shard.size(); ++i) v = std::max(v, shard[i] + 1);
    }
    vocab_ = std::max<int64_t>(vocab_, v);
  }
  description_ = fmt::format(
      "token shards {}: {} files, {} tokens, vocabulary {}; {} sequences of {} + 1 per epoch "
      "({} steps); validation on {}",
      f.data, train_shards_.size(), tokens, vocab_, loader_->sequences_per_epoch(), f.seq,
      loader_->batches_per_epoch(),
      f.val_data.empty() ? std::string("the first batches of the training shards") : f.val_data);
}

std::pair<Tensor, Tensor> TrainingData::next_train() {
  if (loader_) {
    const data::TokenBatch b = loader_->next();
    return {b.inputs(), b.targets()};
  }
  return rows_of(batcher_->next(f_.batch, f_.seq), part_, parts_);
}

BatchStream TrainingData::validation(int64_t part, int64_t parts, uint64_t seed) const {
  if (!loader_) {
    auto batcher = std::make_shared<Batcher>(Batcher{val_text_, std::mt19937_64(seed)});
    return [this, batcher, part, parts] {
      return rows_of(batcher->next(f_.batch, f_.seq), part, parts);
    };
  }
  auto loader = std::make_shared<data::TokenLoader>(
      val_shards_, data::TokenLoaderOptions{.seq_len = f_.seq,
                                            .global_batch = f_.batch,
                                            .dp_rank = part,
                                            .dp_size = parts,
                                            .shuffle = false});
  return [loader] {
    const data::TokenBatch b = loader->next();
    return std::pair{b.inputs(), b.targets()};
  };
}

void TrainingData::save(std::map<std::string, std::string>& metadata) const {
  if (loader_) {
    metadata["data.loader"] = loader_->state().to_json();
    return;
  }
  std::ostringstream sampler;
  sampler << batcher_->rng;
  metadata["data.sampler"] = sampler.str();
}

void TrainingData::restore(const std::map<std::string, std::string>& metadata) {
  const char* key = loader_ ? "data.loader" : "data.sampler";
  const auto it = metadata.find(key);
  TESSEL_CHECK(it != metadata.end(), InvalidArgument,
               "--resume: the checkpoint has no '{}': it was saved by a run on {}", key,
               loader_ ? "a text corpus, not token shards" : "token shards, not a text corpus");
  if (loader_) {
    loader_->restore(data::TokenLoaderState::from_json(it->second));
  } else {
    std::istringstream(it->second) >> batcher_->rng;
  }
}

std::pair<Tensor, Tensor> TrainingData::rows_of(std::pair<Tensor, Tensor> global, int64_t part,
                                                int64_t parts) const {
  const int64_t rows = f_.batch / parts;
  return {narrow(global.first, 0, part * rows, rows), narrow(global.second, 0, part * rows, rows)};
}

}  // namespace tessel::train_gpt
