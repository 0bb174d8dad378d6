// The cuDNN backend in a build without cuDNN or cudnn-frontend: reports itself unavailable.
#include "tessel/base/error.h"
#include "tessel/kernels/attention/cudnn/cudnn_sdpa.h"

namespace tessel::kernels::attention {
namespace {
constexpr const char* kWhy =
    "tessel was built without cuDNN or cudnn-frontend (TESSEL_WITH_CUDNN off, or "
    "scripts/setup.sh has not installed the cudnn-frontend headers)";
[[noreturn]] void unavailable() { throw Unavailable(std::string("cudnn: ") + kWhy); }
}  // namespace

bool cudnn_sdpa_is_available() { return false; }

std::string cudnn_sdpa_unsupported_reason(const AttentionProblem&) { return kWhy; }

std::string cudnn_sdpa_backward_unsupported_reason(const AttentionProblem&, const AttentionView&,
                                                   const AttentionView&, const AttentionView&,
                                                   const AttentionView&, const AttentionView&) {
  return kWhy;
}

int64_t cudnn_sdpa_graph_builds(SdpaDirection) { return 0; }

void cudnn_sdpa_forward(const AttentionProblem&, const AttentionView&, float*) { unavailable(); }

void cudnn_sdpa_backward(const AttentionProblem&, const AttentionView&, const AttentionView&,
                         const float*, const AttentionView&, const AttentionView&,
                         const AttentionView&) {
  unavailable();
}

}  // namespace tessel::kernels::attention
