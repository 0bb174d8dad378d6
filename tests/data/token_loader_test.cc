// TokenLoader: over an epoch every sequence is read exactly once whatever the data-parallel
// degree (1, 2, 3, 4, shuffled or not); ranks' rows of a global batch put together are the same
// global stream on every degree; a loader killed mid-epoch and restored from its saved state on
// another degree continues that stream token by token (across the epoch boundary too); missing,
// truncated and corrupt shards fail naming the file and the offset.

#include "tessel/data/token_loader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "tessel/base/error.h"
#include "tessel/tensor/ops.h"

namespace tessel::data {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSeq = 8;
constexpr int64_t kBatch = 12;  // a multiple of every dp degree tested

class TokenLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("tessel_loader_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Shards whose every token is unique (shard * 1'000'000 + index), so a row names its window.
  // Sizes give 37 + 20 + 15 = 72 sequences of kSeq (+1) tokens: 6 global batches of 12.
  std::vector<fs::path> write_shards(std::vector<size_t> sizes = {37 * kSeq + 1, 20 * kSeq + 5,
                                                                  15 * kSeq + 1}) {
    std::vector<fs::path> paths;
    for (size_t s = 0; s < sizes.size(); ++s) {
      std::vector<uint32_t> tokens(sizes[s]);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(s * 1000000 + i);
      paths.push_back(dir_ / fmt::format("shard_{:06}.bin", s));
      write_token_shard(paths.back(), tokens, {.token_bytes = 4});
    }
    return paths;
  }

  fs::path dir_;
};

TokenLoaderOptions options(int64_t dp_rank, int64_t dp_size, bool shuffle) {
  return {.seq_len = kSeq,
          .global_batch = kBatch,
          .dp_rank = dp_rank,
          .dp_size = dp_size,
          .shuffle = shuffle,
          .seed = 7};
}

// The global stream of `steps` batches read by `dp` ranks: each global batch's rows in rank
// order, each row its seq_len + 1 tokens.
std::vector<std::vector<uint32_t>> read_global(std::vector<TokenLoader>& ranks, int64_t steps) {
  std::vector<std::vector<uint32_t>> rows;
  for (int64_t s = 0; s < steps; ++s) {
    for (auto& loader : ranks) {
      const TokenBatch b = loader.next();
      for (int64_t r = 0; r < b.rows; ++r) {
        rows.emplace_back(b.tokens.begin() + r * (kSeq + 1),
                          b.tokens.begin() + (r + 1) * (kSeq + 1));
      }
    }
  }
  return rows;
}

std::vector<TokenLoader> make_ranks(const std::vector<fs::path>& shards, int64_t dp, bool shuffle) {
  std::vector<TokenLoader> ranks;
  for (int64_t r = 0; r < dp; ++r) ranks.emplace_back(shards, options(r, dp, shuffle));
  return ranks;
}

class TokenLoaderEpochTest : public TokenLoaderTest,
                             public ::testing::WithParamInterface<std::tuple<int, bool>> {};

TEST_P(TokenLoaderEpochTest, EverySequenceOnceAcrossRanks) {
  const auto [dp, shuffle] = GetParam();
  const auto shards = write_shards();
  auto ranks = make_ranks(shards, dp, shuffle);
  ASSERT_EQ(ranks[0].sequences_per_epoch(), 72u);
  ASSERT_EQ(ranks[0].batches_per_epoch(), 6u);
  // Which rank read each window (named by its first token), over one epoch.
  std::map<uint32_t, int> reader;
  for (uint64_t step = 0; step < ranks[0].batches_per_epoch(); ++step) {
    for (int r = 0; r < dp; ++r) {
      const TokenBatch b = ranks[r].next();
      ASSERT_EQ(b.rows, kBatch / dp);
      ASSERT_EQ(b.epoch, 0u);
      const std::vector<int64_t> x = to_vector<int64_t>(b.inputs());
      const std::vector<int64_t> y = to_vector<int64_t>(b.targets());
      for (int64_t row = 0; row < b.rows; ++row) {
        const uint32_t first = b.tokens[row * (kSeq + 1)];
        EXPECT_TRUE(reader.emplace(first, r).second)
            << "window starting at token " << first << " read twice (dp " << dp << ")";
        // A window is kSeq + 1 consecutive tokens of one shard at a multiple of kSeq.
        EXPECT_EQ(first % 1000000 % kSeq, 0u);
        for (int64_t t = 0; t < kSeq; ++t) {
          EXPECT_EQ(x[row * kSeq + t], first + t);
          EXPECT_EQ(y[row * kSeq + t], first + t + 1);  // targets: the inputs shifted by one
        }
      }
    }
  }
  EXPECT_EQ(reader.size(), 72u);
  for (uint32_t s = 0; s < 3; ++s) {
    const uint32_t count = std::vector<uint32_t>{37, 20, 15}[s];
    for (uint32_t i = 0; i < count; ++i) {
      EXPECT_TRUE(reader.count(s * 1000000 + i * kSeq)) << "shard " << s << " window " << i;
    }
  }
  // The next batch starts the second epoch.
  EXPECT_EQ(ranks[0].next().epoch, 1u);
}

INSTANTIATE_TEST_SUITE_P(Dp, TokenLoaderEpochTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()));

// The ranks' rows of each global batch, put together, are the same stream for every degree.
TEST_F(TokenLoaderTest, GlobalStreamIndependentOfDp) {
  const auto shards = write_shards();
  for (bool shuffle : {false, true}) {
    auto one = make_ranks(shards, 1, shuffle);
    const auto want = read_global(one, 14);  // more than two epochs
    for (int dp : {2, 3, 4}) {
      auto ranks = make_ranks(shards, dp, shuffle);
      EXPECT_EQ(read_global(ranks, 14), want) << "dp " << dp << " shuffle " << shuffle;
    }
  }
}

TEST_F(TokenLoaderTest, ShuffleDependsOnSeedAndEpoch) {
  const auto shards = write_shards();
  auto a = make_ranks(shards, 1, true);
  const auto rows = read_global(a, 12);
  const std::vector<std::vector<uint32_t>> epoch0(rows.begin(), rows.begin() + 72);
  const std::vector<std::vector<uint32_t>> epoch1(rows.begin() + 72, rows.end());
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(std::set(epoch0.begin(), epoch0.end()), std::set(epoch1.begin(), epoch1.end()));
  auto plain = make_ranks(shards, 1, false);
  EXPECT_NE(read_global(plain, 6), epoch0);
  TokenLoaderOptions other = options(0, 1, true);
  other.seed = 8;
  std::vector<TokenLoader> b;
  b.emplace_back(shards, other);
  EXPECT_NE(read_global(b, 6), epoch0);
}

// A tail that does not fill a global batch is skipped; every other sequence is read once.
TEST_F(TokenLoaderTest, TailShorterThanABatchIsSkipped) {
  const auto shards = write_shards({37 * kSeq + 1, 21 * kSeq + 1, 15 * kSeq + 1});  // 73
  auto ranks = make_ranks(shards, 3, false);
  EXPECT_EQ(ranks[0].batches_per_epoch(), 6u);
  const auto rows = read_global(ranks, 7);
  EXPECT_EQ(std::set(rows.begin(), rows.begin() + 72).size(), 72u);
  EXPECT_EQ(rows[72], rows[0]);  // the second epoch, unshuffled, starts where the first did
}

// Killed after `cut` steps on `dp_before` ranks, resumed from the saved JSON on `dp_after`:
// the tokens read are those of one uninterrupted run, token by token.
TEST_F(TokenLoaderTest, ResumeOnAnotherDpContinuesTheStream) {
  const auto shards = write_shards();
  for (bool shuffle : {false, true}) {
    auto whole = make_ranks(shards, 1, shuffle);
    const auto want = read_global(whole, 16);
    for (auto [dp_before, dp_after, cut] :
         {std::tuple{2, 3, 4}, std::tuple{4, 1, 1}, std::tuple{3, 2, 6}, std::tuple{1, 4, 9}}) {
      auto before = make_ranks(shards, dp_before, shuffle);
      auto got = read_global(before, cut);
      // Every rank's state is the same global position.
      const std::string saved = before[0].state().to_json();
      for (auto& r : before) EXPECT_EQ(r.state().to_json(), saved);
      before.clear();  // killed
      auto after = make_ranks(shards, dp_after, shuffle);
      for (auto& r : after) r.restore(TokenLoaderState::from_json(saved));
      const auto rest = read_global(after, 16 - cut);
      got.insert(got.end(), rest.begin(), rest.end());
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << "row " << i << " (dp " << dp_before << " -> " << dp_after
                                   << " after " << cut << " steps, shuffle " << shuffle << ")";
      }
    }
  }
}

TEST_F(TokenLoaderTest, StateJsonRoundTripAndErrors) {
  const TokenLoaderState s{.epoch = 3, .position = 48, .seed = 7, .sequences = 72, .seq_len = 8};
  EXPECT_EQ(TokenLoaderState::from_json(s.to_json()), s);
  EXPECT_EQ(s.to_json(), R"({"epoch":3,"position":48,"seed":7,"seq_len":8,"sequences":72})");
  EXPECT_THROW(TokenLoaderState::from_json("not json"), InvalidArgument);
  try {
    TokenLoaderState::from_json(R"({"epoch":3,"seed":7,"sequences":72,"seq_len":8})");
    ADD_FAILURE() << "no error for a missing field";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'position'"), std::string::npos) << e.what();
  }
  // A state from other shards or another seq_len is refused.
  const auto shards = write_shards();
  TokenLoader loader(shards, options(0, 1, true));
  TokenLoaderState other = loader.state();
  other.sequences = 71;
  EXPECT_THROW(loader.restore(other), InvalidArgument);
}

TEST_F(TokenLoaderTest, DocumentIds) {
  std::vector<uint32_t> tokens = {5, 6, 0, 7, 8, 9, 0, 0, 1, 2, 3, 4, 5};  // 0 ends a document
  write_token_shard(dir_ / "doc.bin", tokens, {.token_bytes = 2});
  TokenLoader loader({dir_ / "doc.bin"},
                     {.seq_len = 12, .global_batch = 1, .shuffle = false, .eot_token = 0u});
  const TokenBatch b = loader.next();
  EXPECT_EQ(to_vector<int64_t>(b.document_ids()),
            (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 2, 3, 3, 3, 3}));
  TokenLoader plain({dir_ / "doc.bin"}, {.seq_len = 12, .global_batch = 1, .shuffle = false});
  EXPECT_THROW(plain.next().document_ids(), InvalidArgument);
}

// The error's text contains every needle.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "'" << n << "' not in: " << e.what();
    }
  }
}

TEST_F(TokenLoaderTest, BadShardsNameTheFileAndOffset) {
  auto shards = write_shards();
  // Missing.
  auto missing = shards;
  missing.push_back(dir_ / "shard_000009.bin");
  expect_error([&] { TokenLoader(missing, options(0, 1, false)); },
               {"shard_000009.bin", "No such file"});
  // Truncated: the header promises more tokens than the file holds.
  fs::resize_file(shards[1], fs::file_size(shards[1]) - 6);
  expect_error([&] { TokenLoader(shards, options(0, 1, false)); },
               {shards[1].string(), "offset", "truncated"});
  // Corrupt: a bad magic.
  {
    std::fstream f(shards[2], std::ios::in | std::ios::out | std::ios::binary);
    f.write("XXXXXXXX", 8);
  }
  expect_error(
      [&] {
        TokenLoader({shards[0], shards[2]}, options(0, 1, false));
      },
      {shards[2].string(), "offset 0", "magic"});
  // A glob that matches nothing names the pattern.
  expect_error([&] { expand_shard_glob((dir_ / "nothing_*.bin").string()); }, {"nothing_*.bin"});
  EXPECT_EQ(expand_shard_glob((dir_ / "shard_*.bin").string()), shards);
}

TEST_F(TokenLoaderTest, OptionsThatCannotWork) {
  const auto shards = write_shards();
  expect_error([&] { TokenLoader(shards, {.seq_len = kSeq, .global_batch = 10, .dp_size = 4}); },
               {"global_batch 10", "4 data-parallel ranks"});
  expect_error([&] { TokenLoader(shards, {.seq_len = kSeq, .dp_rank = 2, .dp_size = 2}); },
               {"dp_rank 2"});
  expect_error([&] { TokenLoader(shards, {.seq_len = 0}); }, {"seq_len 0"});
  expect_error([&] { TokenLoader(shards, {.seq_len = kSeq, .global_batch = 73}); },
               {"72 sequences", "global batch of 73"});
  expect_error([&] { TokenLoader({}, {}); }, {"no shard files"});
}

}  // namespace
}  // namespace tessel::data
