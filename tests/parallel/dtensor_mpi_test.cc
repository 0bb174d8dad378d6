// The DTensor property sweep (smaller) over Open MPI: ctest runs this binary under `mpirun -np 4`.
#include <gtest/gtest.h>

#include "tessel/collectives/mpi/mpi_backend.h"
#include "tests/parallel/dtensor_checks.h"

namespace tessel {
namespace {

TEST(DTensorMpiTest, RandomRedistributions) {
  if (!mpi::is_available()) GTEST_SKIP() << "this build has no MPI backend";
  if (!mpi::launched()) GTEST_SKIP() << "not started by mpirun";
  EXPECT_NO_THROW(testing::check_random_redistributions(
      mpi::create_world({.timeout = std::chrono::seconds(60)}), 9000, 30));
}

}  // namespace
}  // namespace tessel
