#pragma once
// Helpers for the GPU attention tests: why a test must skip, inputs made on the CPU and copied
// to the device in a dtype, results brought back as floats, and the error bounds (FlashAttention's
// rule for bf16: at most twice the error of plain bf16 attention against an f32 reference).

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/kernels/attention/attention_math.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"
#include "tessel/kernels/attention/cuda/flash_cuda.h"
#include "tessel/kernels/attention/cuda/math_cuda.h"
#include "tessel/kernels/attention/cudnn/cudnn_sdpa.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/stream.h"

namespace tessel::kernels::attention::testing {

// Empty when CUDA tensors can be made here; otherwise why not.
inline std::string cuda_unusable_reason() {
  if (!cuda::is_built() || !flash_cuda_is_available()) {
    return "tessel was built without CUDA (TESSEL_WITH_CUDA off or nvcc not found)";
  }
  if (cuda::device_count() == 0) return "no CUDA device: " + cuda::unavailable_reason();
  return {};
}

#define TESSEL_SKIP_WITHOUT_CUDA()                                                         \
  do {                                                                                     \
    const std::string why = ::tessel::kernels::attention::testing::cuda_unusable_reason(); \
    if (!why.empty()) GTEST_SKIP() << why;                                                 \
  } while (0)

inline const Device kGpu = Device::cuda(0);

// A CPU f32 tensor in `dtype` on the GPU.
inline Tensor on_gpu(const Tensor& cpu, DType dtype) { return to(to(cpu, dtype), kGpu); }
// The same values back on the CPU in f32.
inline Tensor on_cpu_f32(const Tensor& t) { return to(to(t, Device::cpu()), DType::kF32); }
inline std::vector<float> values(const Tensor& t) { return to_vector<float>(on_cpu_f32(t)); }
// f32 values rounded to `dtype` and back, so that every backend sees identical inputs.
inline Tensor rounded(const Tensor& cpu, DType dtype) { return to(to(cpu, dtype), DType::kF32); }

// The message of the Unavailable that forcing `backend` on q (as q, k and v) throws, or
// "no error".
inline std::string forced_error(SdpaBackend backend, const Tensor& q, SdpaOptions opts = {}) {
  opts.backend = backend;
  try {
    scaled_dot_product_attention(q, q, q, opts);
  } catch (const Unavailable& e) {
    return e.message();
  }
  return "no error";
}

// Lines logged while fn runs with TESSEL_LOGS=kernels=debug.
template <typename Fn>
std::vector<std::string> debug_log(Fn&& fn) {
  std::vector<std::string> lines;
  const LogSink previous =
      set_log_sink([&](LogLevel, std::string_view line) { lines.emplace_back(line); });
  configure_logging("kernels=debug");
  try {
    fn();
  } catch (...) {
    configure_logging("");
    set_log_sink(previous);
    throw;
  }
  configure_logging("");
  set_log_sink(previous);
  return lines;
}

// A view of a tensor for the raw backends.
inline AttentionView view_of(const Tensor& t) { return attention_view_of(t, "tensor"); }

// out, lse, dq, dk, dv of one backend, as CPU f32 values.
struct Results {
  std::vector<float> out, lse, dq, dk, dv;
  std::string declined;  // kCudnn: why cuDNN declines the call (nothing ran); tests skip
};

// ---- Running the backends on one set of inputs --------------------------------------------

enum class Which { kFlashCuda, kMathCuda, kCudnn, kFlashCpu, kMathCpuBf16 };

// Inputs as CPU f32 tensors already rounded to the case's dtype, and the mask.
struct Inputs {
  Tensor q, k, v, dout;
  AttentionProblem mask_only;  // mask, dropout; no views

  explicit Inputs(const KernelCase& c) {
    Generator gen(11);
    q = rounded(randn({c.b, c.hq, c.sq, c.d}, gen), c.dtype);
    k = rounded(randn({c.b, c.hkv, c.sk, c.d}, gen), c.dtype);
    v = rounded(randn({c.b, c.hkv, c.sk, c.d}, gen), c.dtype);
    dout = rounded(randn({c.b, c.hq, c.sq, c.d}, gen), c.dtype);
    configure_mask(c.mask, c.b, c.sq, c.sk, mask_only);
  }
};

// Runs one backend on copies of the inputs in `dtype` (on the GPU or the CPU).
inline Results run(Which which, const Inputs& in, DType dtype, bool deterministic = false) {
  const bool gpu =
      which == Which::kFlashCuda || which == Which::kMathCuda || which == Which::kCudnn;
  auto place = [&](const Tensor& t) { return gpu ? on_gpu(t, dtype) : to(t, dtype); };
  const Tensor q = place(in.q), k = place(in.k), v = place(in.v), dout = place(in.dout);
  const Tensor out = empty_like(q), dq = empty_like(q), dk = empty_like(k), dv = empty_like(v);
  const Tensor lse = empty({q.size(0), q.size(1), q.size(2)}, DType::kF32, q.device());
  AttentionProblem p = in.mask_only;
  p.q = view_of(q);
  p.k = view_of(k);
  p.v = view_of(v);
  p.deterministic = deterministic;
  const AttentionView o = view_of(out), g = view_of(dout);
  switch (which) {
    case Which::kFlashCuda:
      flash_cuda_forward(p, o, lse.data<float>());
      flash_cuda_backward(p, o, g, lse.data<float>(), view_of(dq), view_of(dk), view_of(dv));
      break;
    case Which::kCudnn: {
      std::string why = cudnn_sdpa_unsupported_reason(p);
      if (why.empty())
        why =
            cudnn_sdpa_backward_unsupported_reason(p, o, g, view_of(dq), view_of(dk), view_of(dv));
      if (!why.empty()) return {.declined = why};
      cudnn_sdpa_forward(p, o, lse.data<float>());
      cudnn_sdpa_backward(p, o, g, lse.data<float>(), view_of(dq), view_of(dk), view_of(dv));
      break;
    }
    case Which::kMathCuda:
      math_cuda_forward(p, o, lse.data<float>());
      math_cuda_backward(p, g, view_of(dq), view_of(dk), view_of(dv));
      break;
    case Which::kFlashCpu:
      flash_cpu_forward(p, o, lse.data<float>());
      flash_cpu_backward(p, o, g, lse.data<float>(), view_of(dq), view_of(dk), view_of(dv));
      break;
    case Which::kMathCpuBf16: {
      const MathOptions plain{.round_intermediates = true};
      math_attention_forward(p, o, lse.data<float>(), plain);
      math_attention_backward(p, g, view_of(dq), view_of(dk), view_of(dv), plain);
      break;
    }
  }
  return {values(out), values(lse), values(dq), values(dk), values(dv)};
}

// Per tensor (out, dq, dk, dv): the largest error a 16-bit backend may have against the f32
// reference. bf16: twice plain bf16 attention's; f16: a fixed relative bound.
inline std::vector<double> bounds(const Inputs& in, DType dtype, const Results& ref) {
  const std::vector<float>* refs[] = {&ref.out, &ref.dq, &ref.dk, &ref.dv};
  std::vector<double> out(4);
  if (dtype == DType::kBF16) {
    const Results plain = run(Which::kMathCpuBf16, in, DType::kBF16);
    const std::vector<float>* plains[] = {&plain.out, &plain.dq, &plain.dk, &plain.dv};
    for (int t = 0; t < 4; ++t) out[t] = 2 * max_abs_diff_inf(*plains[t], *refs[t]) + 1e-4;
  } else {
    for (int t = 0; t < 4; ++t) out[t] = 5e-3 * std::max(1.0, max_abs(*refs[t])) + 1e-4;
  }
  return out;
}

inline void expect_within(const Results& got, const Results& ref, const std::vector<double>& bound,
                          const char* who) {
  const std::vector<float>* gots[] = {&got.out, &got.dq, &got.dk, &got.dv};
  const std::vector<float>* refs[] = {&ref.out, &ref.dq, &ref.dk, &ref.dv};
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (int t = 0; t < 4; ++t) {
    EXPECT_LE(max_abs_diff_inf(*gots[t], *refs[t]), bound[t]) << who << " " << names[t];
  }
  EXPECT_LE(max_abs_diff_inf(got.lse, ref.lse), 2e-3) << who << " lse";
}

}  // namespace tessel::kernels::attention::testing
