// Built when MPI was not found: the backend reports itself unavailable.
#include <cstdlib>

#include "tessel/base/error.h"
#include "tessel/collectives/mpi/mpi_backend.h"

namespace tessel {

bool mpi::is_available() { return false; }

std::shared_ptr<ProcessGroup> mpi::create_world(ProcessGroupOptions) {
  throw Unavailable(
      "this tessel build has no MPI backend (install libopenmpi-dev and configure "
      "with TESSEL_WITH_MPI=ON)");
}

}  // namespace tessel
