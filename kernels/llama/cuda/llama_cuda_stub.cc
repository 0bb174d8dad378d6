// The Llama kernels on CUDA in a build without CUDA: report themselves unavailable.
#include "tessel/base/error.h"
#include "tessel/kernels/llama/cuda/llama_cuda.h"

namespace tessel::kernels {
namespace {
[[noreturn]] void unavailable() {
  throw Unavailable(
      "llama_cuda: tessel was built without CUDA (TESSEL_WITH_CUDA off or nvcc not found)");
}
}  // namespace

bool llama_cuda_is_available() { return false; }

void rope_cuda(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&) { unavailable(); }

void swiglu_cuda_forward(const Tensor&, const Tensor&, const Tensor&) { unavailable(); }

void swiglu_cuda_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&) {
  unavailable();
}

}  // namespace tessel::kernels
