// The padded plan of an uneven all_gather / reduce_scatter (collectives/internal/padded_exchange.h)
// executed on host buffers with an emulated even collective, against the layout the direct
// path gives (rank parts concatenated in rank order; rank r's slice of the sum): the NCCL
// backend's staging path must give the same bytes as the broadcasts and reduces it replaced.

#include "tessel/collectives/internal/padded_exchange.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "tessel/base/error.h"

namespace tessel::internal {
namespace {

using Buffer = std::vector<double>;
constexpr double kGarbage = -1e300;  // what unwritten staging holds (padding)

void run_copies(const std::vector<ElementCopy>& copies, const Buffer& from, Buffer& to) {
  for (const ElementCopy& c : copies) {
    ASSERT_LE(c.from + c.count, static_cast<int64_t>(from.size()));
    ASSERT_LE(c.to + c.count, static_cast<int64_t>(to.size()));
    for (int64_t i = 0; i < c.count; ++i) to[c.to + i] = from[c.from + i];
  }
}

int64_t total(const std::vector<int64_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

// Every rank's output of the padded all_gather, emulated as the backend runs it.
std::vector<Buffer> padded_all_gather(const std::vector<int64_t>& counts,
                                      const std::vector<Buffer>& inputs) {
  const PaddedExchange plan = plan_padded_exchange(counts);
  const int n = static_cast<int>(counts.size());
  std::vector<Buffer> staging(n, Buffer(plan.staging_elements(), kGarbage));
  for (int r = 0; r < n; ++r) {  // each rank copies its input to its place in its staging
    std::copy(inputs[r].begin(), inputs[r].end(), staging[r].begin() + r * plan.part);
  }
  // The even all_gather, in place: every rank gets every rank's part-sized slice.
  std::vector<Buffer> gathered(n, Buffer(plan.staging_elements()));
  for (int dst = 0; dst < n; ++dst) {
    for (int src = 0; src < n; ++src) {
      std::copy_n(staging[src].begin() + src * plan.part, plan.part,
                  gathered[dst].begin() + src * plan.part);
    }
  }
  std::vector<Buffer> outputs(n, Buffer(total(counts), 0));
  for (int r = 0; r < n; ++r) run_copies(plan.unpack, gathered[r], outputs[r]);
  return outputs;
}

// Every rank's output of the padded reduce_scatter (sum), emulated as the backend runs it.
std::vector<Buffer> padded_reduce_scatter(const std::vector<int64_t>& counts,
                                          const std::vector<Buffer>& inputs) {
  const PaddedExchange plan = plan_padded_exchange(counts);
  const int n = static_cast<int>(counts.size());
  std::vector<Buffer> staging(n, Buffer(plan.staging_elements(), 0));
  for (int r = 0; r < n; ++r) {
    // Padding differs per rank: it must reach no element that is kept.
    std::fill(staging[r].begin(), staging[r].end(), 1000.0 * (r + 1));
    run_copies(plan.pack, inputs[r], staging[r]);
  }
  std::vector<Buffer> outputs(n);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < counts[r]; ++i) {
      double sum = 0;
      for (int src = 0; src < n; ++src) sum += staging[src][r * plan.part + i];
      outputs[r].push_back(sum);
    }
  }
  return outputs;
}

std::vector<std::vector<int64_t>> count_cases() {
  return {{5},
          {0},
          {3, 3},
          {4, 4, 4, 1},
          {4, 4, 4, 0},
          {1, 4, 4},
          {4, 0, 4},
          {0, 0, 7},
          {7, 0, 0},
          {2, 5, 1, 5, 3},
          {0, 0, 0, 0},
          {9, 8, 8, 8},
          {1, 2, 3, 4, 5},
          {6, 6, 6, 6, 6, 6, 6, 2}};
}

std::vector<Buffer> rank_values(const std::vector<int64_t>& sizes, int64_t each) {
  std::vector<Buffer> out;
  for (size_t r = 0; r < sizes.size(); ++r) {
    Buffer b(each >= 0 ? each : sizes[r]);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<double>(r * 100 + i);
    out.push_back(b);
  }
  return out;
}

TEST(PaddedExchangeTest, AllGatherLayoutMatchesRankOrderConcatenation) {
  for (const auto& counts : count_cases()) {
    SCOPED_TRACE(::testing::PrintToString(counts));
    const std::vector<Buffer> inputs = rank_values(counts, -1);
    Buffer expected;
    for (const Buffer& in : inputs) expected.insert(expected.end(), in.begin(), in.end());
    for (const Buffer& out : padded_all_gather(counts, inputs)) EXPECT_EQ(out, expected);
  }
}

TEST(PaddedExchangeTest, ReduceScatterGivesEachRankItsSliceOfTheSum) {
  for (const auto& counts : count_cases()) {
    SCOPED_TRACE(::testing::PrintToString(counts));
    const int64_t n = total(counts);
    const std::vector<Buffer> inputs = rank_values(counts, n);
    Buffer sum(n, 0);
    for (const Buffer& in : inputs) {
      for (int64_t i = 0; i < n; ++i) sum[i] += in[i];
    }
    const std::vector<Buffer> outputs = padded_reduce_scatter(counts, inputs);
    int64_t at = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      EXPECT_EQ(outputs[r], Buffer(sum.begin() + at, sum.begin() + at + counts[r])) << "rank " << r;
      at += counts[r];
    }
  }
}

TEST(PaddedExchangeTest, FullNeighbouringPartsMergeIntoOneCopy) {
  // FSDP's usual shape: every rank full but the last: one copy each way.
  PaddedExchange plan = plan_padded_exchange(std::vector<int64_t>{4, 4, 4, 1});
  EXPECT_EQ(plan.part, 4);
  EXPECT_EQ(plan.staging_elements(), 16);
  EXPECT_EQ(plan.offsets, (std::vector<int64_t>{0, 4, 8, 12}));
  EXPECT_EQ(plan.pack, (std::vector<ElementCopy>{{0, 0, 13}}));
  EXPECT_EQ(plan.unpack, (std::vector<ElementCopy>{{0, 0, 13}}));
  // A short part ends a run; an empty one makes no copy.
  plan = plan_padded_exchange(std::vector<int64_t>{1, 4, 4, 0, 4});
  EXPECT_EQ(plan.pack, (std::vector<ElementCopy>{{0, 0, 1}, {1, 4, 8}, {9, 16, 4}}));
  plan = plan_padded_exchange(std::vector<int64_t>{0, 0, 0});
  EXPECT_EQ(plan.part, 0);
  EXPECT_TRUE(plan.pack.empty());
}

TEST(PaddedExchangeTest, EvenCountsAndBadInput) {
  EXPECT_TRUE(counts_even(std::vector<int64_t>{3, 3, 3}));
  EXPECT_FALSE(counts_even(std::vector<int64_t>{3, 3, 2}));
  EXPECT_THROW(plan_padded_exchange(std::vector<int64_t>{}), InvalidArgument);
  EXPECT_THROW(plan_padded_exchange(std::vector<int64_t>{2, -1}), InvalidArgument);
}

}  // namespace
}  // namespace tessel::internal
