// TokenLoader: windows of every shard, one order per epoch, each rank's part of a global batch.

#include "tessel/data/token_loader.h"

#include <fmt/format.h>
#include <glob.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "tessel/base/error.h"

namespace tessel::data {
namespace {

// splitmix64: a fixed generator, so an order is the same on every platform and library.
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A Fisher-Yates permutation of [0, n) from (seed, epoch).
std::vector<uint64_t> epoch_order(uint64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> order(n);
  for (uint64_t i = 0; i < n; ++i) order[i] = i;
  uint64_t x = seed ^ (epoch * 0xd1b54a32d192ed03ULL);
  for (uint64_t i = n; i > 1; --i) {
    const uint64_t j = splitmix64(x) % i;  // bias below 2^-40 for any realistic n
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

Tensor slice_rows(const TokenBatch& b, int64_t offset) {
  std::vector<int64_t> out(static_cast<size_t>(b.rows * b.seq_len));
  const size_t width = static_cast<size_t>(b.seq_len + 1);
  for (int64_t r = 0; r < b.rows; ++r) {
    for (int64_t t = 0; t < b.seq_len; ++t) {
      out[r * b.seq_len + t] = b.tokens[r * width + t + offset];
    }
  }
  return from_vector<int64_t>(out, {b.rows, b.seq_len});
}

}  // namespace

std::vector<std::filesystem::path> expand_shard_glob(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::filesystem::path> paths;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  TESSEL_CHECK(!paths.empty(), InvalidArgument,
               "token shards '{}': no file matches the pattern (expected shards written by "
               "tessel-tokenize, e.g. DIR/shard_*.bin)",
               pattern);
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::string TokenLoaderState::to_json() const {
  return nlohmann::json{{"epoch", epoch},
                        {"position", position},
                        {"seed", seed},
                        {"sequences", sequences},
                        {"seq_len", seq_len}}
      .dump();
}

TokenLoaderState TokenLoaderState::from_json(std::string_view json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  TESSEL_CHECK(j.is_object(), InvalidArgument,
               "token loader state '{}': not a JSON object (expected TokenLoaderState::to_json's)",
               json);
  auto field = [&](const char* name) -> uint64_t {
    TESSEL_CHECK(j.contains(name) && j[name].is_number_unsigned(), InvalidArgument,
                 "token loader state '{}': field '{}' is missing or not a non-negative integer",
                 json, name);
    return j[name].get<uint64_t>();
  };
  TokenLoaderState s;
  s.epoch = field("epoch");
  s.position = field("position");
  s.seed = field("seed");
  s.sequences = field("sequences");
  s.seq_len = static_cast<int64_t>(field("seq_len"));
  return s;
}

Tensor TokenBatch::inputs() const { return slice_rows(*this, 0); }
Tensor TokenBatch::targets() const { return slice_rows(*this, 1); }

Tensor TokenBatch::document_ids() const {
  TESSEL_CHECK(eot_token.has_value(), InvalidArgument,
               "document_ids: the loader has no eot_token (set TokenLoaderOptions::eot_token to "
               "the shards' document separator)");
  std::vector<int64_t> out(static_cast<size_t>(rows * seq_len));
  const size_t width = static_cast<size_t>(seq_len + 1);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t doc = 0;
    for (int64_t t = 0; t < seq_len; ++t) {
      out[r * seq_len + t] = doc;
      if (tokens[r * width + t] == *eot_token) ++doc;
    }
  }
  return from_vector<int64_t>(out, {rows, seq_len});
}

TokenLoader::TokenLoader(const std::vector<std::filesystem::path>& shards,
                         const TokenLoaderOptions& options)
    : options_(options) {
  TESSEL_CHECK(!shards.empty(), InvalidArgument, "token loader: no shard files given");
  TESSEL_CHECK(options.seq_len >= 1, InvalidArgument,
               "token loader: seq_len {}: expected at least 1", options.seq_len);
  TESSEL_CHECK(options.dp_size >= 1 && options.dp_rank >= 0 && options.dp_rank < options.dp_size,
               InvalidArgument, "token loader: dp_rank {} of dp_size {}: expected 0 <= rank < size",
               options.dp_rank, options.dp_size);
  TESSEL_CHECK(options.global_batch >= 1 && options.global_batch % options.dp_size == 0,
               InvalidArgument,
               "token loader: global_batch {} does not split over {} data-parallel ranks: expected "
               "a positive multiple of {}",
               options.global_batch, options.dp_size, options.dp_size);
  const uint64_t T = static_cast<uint64_t>(options.seq_len);
  shards_.reserve(shards.size());
  for (const auto& path : shards) {
    shards_.emplace_back(path);
    const uint64_t n = shards_.back().size();
    const uint64_t count = n > T ? (n - 1) / T : 0;
    for (uint64_t i = 0; i < count; ++i) {
      windows_.push_back({static_cast<uint32_t>(shards_.size() - 1), i * T});
    }
  }
  TESSEL_CHECK(windows_.size() >= static_cast<uint64_t>(options.global_batch), InvalidArgument,
               "token loader: {} shard(s) from '{}' hold {} sequences of {} + 1 tokens, fewer than "
               "one global batch of {}",
               shards.size(), shards.front().string(), windows_.size(), options.seq_len,
               options.global_batch);
  start_epoch(0);
}

void TokenLoader::start_epoch(uint64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  if (options_.shuffle) {
    order_ = epoch_order(windows_.size(), options_.seed, epoch);
  } else {
    order_.clear();
  }
}

uint64_t TokenLoader::batches_per_epoch() const {
  return windows_.size() / static_cast<uint64_t>(options_.global_batch);
}

TokenBatch TokenLoader::next() {
  const uint64_t B = static_cast<uint64_t>(options_.global_batch);
  if (position_ + B > windows_.size()) start_epoch(epoch_ + 1);  // the tail is skipped
  const uint64_t rows = B / static_cast<uint64_t>(options_.dp_size);
  const uint64_t width = static_cast<uint64_t>(options_.seq_len) + 1;
  TokenBatch batch;
  batch.rows = static_cast<int64_t>(rows);
  batch.seq_len = options_.seq_len;
  batch.eot_token = options_.eot_token;
  batch.epoch = epoch_;
  batch.first_sequence = position_;
  batch.tokens.resize(rows * width);
  const uint64_t first = position_ + static_cast<uint64_t>(options_.dp_rank) * rows;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint64_t i = order_.empty() ? first + r : order_[first + r];
    const Window& w = windows_[i];
    shards_[w.shard].read(w.start, std::span<uint32_t>(batch.tokens).subspan(r * width, width));
  }
  position_ += B;
  return batch;
}

TokenLoaderState TokenLoader::state() const {
  return {.epoch = epoch_,
          .position = position_,
          .seed = options_.seed,
          .sequences = windows_.size(),
          .seq_len = options_.seq_len};
}

void TokenLoader::restore(const TokenLoaderState& state) {
  TESSEL_CHECK(state.sequences == windows_.size() && state.seq_len == options_.seq_len,
               InvalidArgument,
               "token loader: the saved state was made over {} sequences of {} tokens, but these "
               "shards hold {} sequences of {}: resume on the same shards and --seq",
               state.sequences, state.seq_len, windows_.size(), options_.seq_len);
  options_.seed = state.seed;
  start_epoch(state.epoch);
  position_ = state.position;
}

}  // namespace tessel::data
