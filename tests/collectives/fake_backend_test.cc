// The fake backend: groups of 65,536 ranks are cheap; calls complete at once and are logged with
// the bytes a ring algorithm would send.

#include "tessel/collectives/fake/fake_backend.h"

#include <gtest/gtest.h>

#include "tessel/base/error.h"

namespace tessel {
namespace {

TEST(FakeBackendTest, LogsRingBytesAtScale) {
  auto log = std::make_shared<fake::FakeLog>();
  auto pg = fake::create_process_group(12345, 65536, log, {.name = "dp", .id = 5});
  EXPECT_EQ(pg->rank(), 12345);
  EXPECT_EQ(pg->size(), 65536);
  Tensor t = zeros({65536});
  pg->all_reduce(t);
  Tensor shard = zeros({1});
  pg->all_gather(shard, t);
  const auto calls = log->calls();
  ASSERT_EQ(calls.size(), 2u);
  const int64_t bytes = 65536 * 4;
  EXPECT_EQ(calls[0].op, fr::OpType::kAllReduce);
  EXPECT_EQ(calls[0].bytes_sent, 2 * (bytes * 65535 / 65536));
  EXPECT_EQ(calls[1].op, fr::OpType::kAllGather);
  EXPECT_EQ(calls[1].seq, 2u);
  EXPECT_EQ(calls[1].bytes_sent, bytes * 65535 / 65536);
  EXPECT_EQ(log->total_bytes_sent(), calls[0].bytes_sent + calls[1].bytes_sent);
}

TEST(FakeBackendTest, SplitIsNotImplementedWithAHint) {
  auto pg = fake::create_process_group(0, 4);
  EXPECT_THROW(pg->split(0, 0), NotImplemented);
  EXPECT_THROW(fake::create_process_group(4, 4), InvalidArgument);
}

}  // namespace
}  // namespace tessel
