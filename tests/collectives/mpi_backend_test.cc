// The MPI backend, run under `mpirun -np N` by ctest (see CMakeLists.txt): every collective x
// dtypes x counts against local expectations, split into odd colours, a send/recv ring. Every
// rank runs the same tests; a failure on any rank fails mpirun.

#include "tessel/collectives/mpi/mpi_backend.h"

#include <gtest/gtest.h>

#include "collective_checks.h"
#include "tessel/base/error.h"

namespace tessel {
namespace {

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> group =
      mpi::create_world({.timeout = std::chrono::seconds(60)});
  return group;
}

class MpiBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpi::is_available()) GTEST_SKIP() << "this build has no MPI backend";
    if (!mpi::launched()) GTEST_SKIP() << "not started by mpirun";
  }
};

TEST_F(MpiBackendTest, EveryCollectiveMatchesLocalExpectation) {
  testing::check_everything(*world(), testing::acceptance_counts(/*large=*/false));
}

TEST_F(MpiBackendTest, OneMillionElements) { testing::check_one_million(*world()); }

TEST_F(MpiBackendTest, SplitsIntoOddColours) {
  testing::check_split(*world(), 3, /*with_no_color=*/false);
  testing::check_split(*world(), 2, /*with_no_color=*/world()->size() > 1);
}

// MPI cannot time a call out itself: the watchdog fails the Work. Rank 0's all_reduce waits for
// rank 1, which calls it only after rank 0 has seen the Timeout (told through a second group),
// which also releases rank 0's blocked worker.
TEST_F(MpiBackendTest, WatchdogTimesOutACallMpiCannotCancel) {
  auto pg = world();
  if (pg->size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  static std::shared_ptr<ProcessGroup> side = mpi::create_world({.name = "side", .id = 1});
  Tensor t = from_vector<float>({1.0f});
  if (pg->rank() == 0) {
    Work w = pg->all_reduce(t, {.timeout = std::chrono::milliseconds(500), .async = true});
    try {
      w.wait(std::chrono::seconds(30));
      ADD_FAILURE() << "all_reduce finished without rank 1";
    } catch (const Timeout& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("on group 'world'"), std::string::npos) << what;
      EXPECT_NE(what.find("(watchdog)"), std::string::npos) << what;
    }
  }
  side->barrier();
  if (pg->rank() != 0) pg->all_reduce(t);
  pg->barrier();  // rank 0's barrier queues behind its still-running all_reduce
}

}  // namespace
}  // namespace tessel
