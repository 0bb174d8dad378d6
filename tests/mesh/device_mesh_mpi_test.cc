// A 2x2 mesh over Open MPI: ctest runs this binary under `mpirun -np 4`.
#include <gtest/gtest.h>

#include "tessel/collectives/mpi/mpi_backend.h"
#include "tests/mesh/mesh_check.h"

namespace tessel {
namespace {

TEST(DeviceMeshMpiTest, TwoByTwoOverFourRanks) {
  if (!mpi::is_available()) GTEST_SKIP() << "this build has no MPI backend";
  if (!mpi::launched()) GTEST_SKIP() << "not started by mpirun";
  // check_two_by_two_mesh throws, naming the rank and the value, on any wrong group or sum.
  EXPECT_NO_THROW(
      testing::check_two_by_two_mesh(mpi::create_world({.timeout = std::chrono::seconds(60)})));
}

}  // namespace
}  // namespace tessel
