// Counter-based RNG: reproducible across thread counts and generator offsets; distributions.
#include "tessel/tensor/random.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel {
namespace {

// Philox4x32-10 known-answer vectors from the Random123 distribution (kat_vectors).
TEST(PhiloxTest, KnownAnswers) {
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(
      philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(
      philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(RandomTest, SameNumbersForAnyThreadCount) {
  const int before = num_threads();
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3, 7}) {
    set_num_threads(threads);
    Generator gen(42);
    runs.push_back(to_vector<float>(randn({100001}, gen)));
    Generator dgen(42);
    const auto mask = to_vector<float>(dropout(ones({50001}), 0.3, true, &dgen));
    runs.back().insert(runs.back().end(), mask.begin(), mask.end());
  }
  set_num_threads(before);
  for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[i], runs[0]);
}

TEST(RandomTest, ElementIsAFunctionOfSeedAndOffset) {
  Generator gen(9);
  const auto first = to_vector<float>(rand({10}, gen));
  const auto second = to_vector<float>(rand({5}, gen));  // continues at offset 10
  EXPECT_EQ(gen.offset(), 15u);
  Generator whole(9);
  const auto all = to_vector<float>(rand({15}, whole));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(all[i], first[i]);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(all[10 + i], second[i]);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(all[i], philox_uniform(9, i));
  Generator other(10);
  EXPECT_NE(to_vector<float>(rand({15}, other)), all);
}

TEST(RandomTest, DistributionMoments) {
  Generator gen(1);
  const auto u = to_vector<float>(rand({200000}, gen));
  const auto n = to_vector<float>(randn({200000}, gen));
  double su = 0, sn = 0, sn2 = 0;
  for (float v : u) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LT(v, 1.0f);
    su += v;
  }
  for (float v : n) sn += v, sn2 += double(v) * v;
  EXPECT_NEAR(su / u.size(), 0.5, 0.005);
  EXPECT_NEAR(sn / n.size(), 0.0, 0.01);
  EXPECT_NEAR(sn2 / n.size(), 1.0, 0.02);
}

TEST(RandomTest, DefaultGeneratorManualSeed) {
  manual_seed(77);
  const auto a = to_vector<float>(randn({8}));
  manual_seed(77);
  EXPECT_EQ(to_vector<float>(randn({8})), a);
}

}  // namespace
}  // namespace tessel
