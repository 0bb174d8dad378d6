// The math backend on CUDA in a build without CUDA: reports itself unavailable.
#include "tessel/base/error.h"
#include "tessel/kernels/attention/cuda/math_cuda.h"

namespace tessel::kernels::attention {
namespace {
[[noreturn]] void unavailable() {
  throw Unavailable(
      "math_cuda: tessel was built without CUDA (TESSEL_WITH_CUDA off or nvcc "
      "not found)");
}
}  // namespace

bool math_cuda_is_available() { return false; }

void math_cuda_forward(const AttentionProblem&, const AttentionView&, float*) { unavailable(); }

void math_cuda_backward(const AttentionProblem&, const AttentionView&, const AttentionView&,
                        const AttentionView&, const AttentionView&) {
  unavailable();
}

}  // namespace tessel::kernels::attention
