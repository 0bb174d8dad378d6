// Built when NCCL was not found: the backend reports itself unavailable.
#include "tessel/base/error.h"
#include "tessel/collectives/nccl/nccl_backend.h"

namespace tessel {

bool nccl::is_available() { return false; }

std::shared_ptr<ProcessGroup> nccl::create_process_group(std::shared_ptr<Store>, int, int,
                                                         NcclOptions) {
  throw Unavailable(
      "this tessel build has no NCCL backend (configure with TESSEL_WITH_CUDA=ON "
      "on a machine with the CUDA toolkit and NCCL)");
}

}  // namespace tessel
