// flash_cuda in a build without CUDA: reports itself unavailable.
#include "tessel/base/error.h"
#include "tessel/kernels/attention/cuda/flash_cuda.h"

namespace tessel::kernels::attention {
namespace {
[[noreturn]] void unavailable() {
  throw Unavailable(
      "flash_cuda: tessel was built without CUDA (TESSEL_WITH_CUDA off or nvcc "
      "not found)");
}
}  // namespace

bool flash_cuda_is_available() { return false; }

int cuda_compute_capability(int) { return 0; }

void flash_cuda_forward(const AttentionProblem&, const AttentionView&, float*) { unavailable(); }

void flash_cuda_backward(const AttentionProblem&, const AttentionView&, const AttentionView&,
                         const float*, const AttentionView&, const AttentionView&,
                         const AttentionView&) {
  unavailable();
}

}  // namespace tessel::kernels::attention
