// The grouped matmul on CUDA in a build without CUDA: reports itself unavailable.
#include "tessel/base/error.h"
#include "tessel/kernels/moe/cuda/grouped_matmul_cuda.h"

namespace tessel::kernels {
namespace {
[[noreturn]] void unavailable() {
  throw Unavailable(
      "grouped_matmul_cuda: tessel was built without CUDA (TESSEL_WITH_CUDA off or nvcc not "
      "found)");
}
}  // namespace

bool grouped_matmul_cuda_is_available() { return false; }

void grouped_matmul_cuda(const Tensor&, const Tensor&, const Tensor&, bool, const Tensor&) {
  unavailable();
}

void grouped_matmul_cuda_weight_grad(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  unavailable();
}

}  // namespace tessel::kernels
