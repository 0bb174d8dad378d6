// mpi::launched() needs no MPI library, so it is built with and without the backend.
#include <cstdlib>

#include "tessel/base/launch_env.h"
#include "tessel/collectives/mpi/mpi_backend.h"

namespace tessel {

bool mpi::launched() {
  using namespace launch_env;
  return std::getenv(kOmpiSize) != nullptr || std::getenv(kPmiSize) != nullptr ||
         std::getenv(kPmixRank) != nullptr;
}

}  // namespace tessel
