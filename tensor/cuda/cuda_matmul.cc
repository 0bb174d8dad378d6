// CUDA matmul on cuBLASLt: f32, bf16 and f16 operands with f32 accumulation (f32 on TF32 tensor
// cores only when cuda::set_matmul_allow_tf32 says so), bf16/f16 products written as f32 when
// the output is f32, row- or column-major operands without copies, batch dims (broadcast ones
// included) as strided batches, an optional bias in the epilogue (addmm), and the workspace
// from the caching allocator on the current stream.
//
// cuBLASLt is column-major; a row-major [M, N] output is a column-major [N, M] matrix, so the
// product is computed as out^T = b^T a^T (cuda_gemm_plan.h).
#include <cublasLt.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/cuda/cuda_backend.h"
#include "tessel/tensor/cuda/cuda_gemm_plan.h"
#include "tessel/tensor/cuda/cuda_runtime.h"
#include "tessel/tensor/cuda/gemm_cache.h"

namespace tessel::cuda {
namespace {

// Hopper's recommended cuBLASLt workspace; the heuristics may use less.
constexpr size_t kMaxWorkspaceBytes = size_t{32} << 20;
constexpr int64_t kInt32Max = (int64_t{1} << 31) - 1;

// ---- RAII owners of cuBLASLt objects ------------------------------------------------------------

class MatmulDesc {
 public:
  MatmulDesc(cublasComputeType_t compute, int device) {
    check_cublas(cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F), "cublasLtMatmulDescCreate",
                 device);
  }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc_); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value, int device) {
    check_cublas(cublasLtMatmulDescSetAttribute(desc_, attr, &value, sizeof(value)),
                 "cublasLtMatmulDescSetAttribute", device);
  }
  cublasLtMatmulDesc_t get() const { return desc_; }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
};

class MatrixLayout {
 public:
  MatrixLayout(cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld, int32_t batch,
               int64_t batch_stride, int device) {
    check_cublas(cublasLtMatrixLayoutCreate(&layout_, type, rows, cols, ld),
                 "cublasLtMatrixLayoutCreate", device);
    if (batch > 1) {
      check_cublas(cublasLtMatrixLayoutSetAttribute(layout_, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                    &batch, sizeof(batch)),
                   "cublasLtMatrixLayoutSetAttribute (batch count)", device);
      check_cublas(
          cublasLtMatrixLayoutSetAttribute(layout_, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                           &batch_stride, sizeof(batch_stride)),
          "cublasLtMatrixLayoutSetAttribute (batch stride)", device);
    }
  }
  ~MatrixLayout() { cublasLtMatrixLayoutDestroy(layout_); }
  MatrixLayout(const MatrixLayout&) = delete;
  MatrixLayout& operator=(const MatrixLayout&) = delete;
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

class Preference {
 public:
  explicit Preference(int device) {
    check_cublas(cublasLtMatmulPreferenceCreate(&pref_), "cublasLtMatmulPreferenceCreate", device);
  }
  ~Preference() { cublasLtMatmulPreferenceDestroy(pref_); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const T& value, int device) {
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref_, attr, &value, sizeof(value)),
                 "cublasLtMatmulPreferenceSetAttribute", device);
  }
  cublasLtMatmulPreference_t get() const { return pref_; }

 private:
  cublasLtMatmulPreference_t pref_ = nullptr;
};

// ---- Per-device handle; per-thread cache of each GEMM's cuBLASLt setup ------------------------

// One device's cuBLASLt handle (thread-safe to share).
class DeviceLt {
 public:
  explicit DeviceLt(int device) {
    DeviceGuard guard(device);
    check_cublas(cublasLtCreate(&handle_), "cublasLtCreate", device);
  }
  ~DeviceLt() { cublasLtDestroy(handle_); }
  DeviceLt(const DeviceLt&) = delete;
  DeviceLt& operator=(const DeviceLt&) = delete;
  cublasLtHandle_t handle() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

DeviceLt& device_lt(int device) {
  static std::mutex mu;
  static auto* devices = new std::vector<std::unique_ptr<DeviceLt>>;  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  if (devices->size() <= static_cast<size_t>(device)) devices->resize(device + 1);
  auto& d = (*devices)[device];
  if (!d) d = std::make_unique<DeviceLt>(device);
  return *d;
}

// ---- The problem in cuBLASLt's terms ------------------------------------------------------------

cudaDataType cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      break;
  }
  throw InvalidArgument(
      fmt::format("the CUDA matmul takes f32, bf16 and f16, got {}", dtype_name(dtype)));
}

// The largest power of two (up to 256) dividing the address and, for batches, the batch stride.
uint32_t alignment(const void* p, int64_t batch_stride_bytes) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch_stride_bytes != 0) v |= static_cast<uint64_t>(batch_stride_bytes);
  return static_cast<uint32_t>(v & (~v + 1));
}

// One cuBLASLt call: D [m x n] (col-major, ld ldd) = op(A) [m x k] op(B) [k x n] (+ bias[m]),
// `batch` times with the given element strides.
struct Gemm {
  DType ab_dtype, d_dtype;
  GemmPlan plan;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
  DType bias_dtype = DType::kF32;
};

void check_int32(int64_t v, const char* what) {
  TESSEL_CHECK(v >= 0 && v <= kInt32Max, InvalidArgument,
               "matmul: {} is {}; cuBLASLt takes at most 2^31 - 1", what, v);
}

// Everything cuBLASLt needs for one problem but the pointers: made once per GemmKey.
struct GemmSetup {
  GemmSetup(cublasComputeType_t compute, cudaDataType ab_type, cudaDataType d_type,
            const GemmPlan& p, int dev)
      : desc(compute, dev),
        la(ab_type, p.A.rows, p.A.cols, p.A.ld, static_cast<int32_t>(p.batch), p.stride_a, dev),
        lb(ab_type, p.B.rows, p.B.cols, p.B.ld, static_cast<int32_t>(p.batch), p.stride_b, dev),
        ld(d_type, p.m, p.n, p.ldd, static_cast<int32_t>(p.batch), p.stride_d, dev) {}
  MatmulDesc desc;
  MatrixLayout la, lb, ld;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

// Setups this thread made, by problem (gemm_cache.h): a training step's GEMMs repeat, so after
// the first step no matmul creates a descriptor, a layout or a preference, or asks the heuristic.
constexpr size_t kGemmCacheEntries = 1024;
GemmCache<std::unique_ptr<GemmSetup>>& thread_gemm_cache() {
  thread_local GemmCache<std::unique_ptr<GemmSetup>> cache(kGemmCacheEntries);
  return cache;
}

}  // namespace

GemmCacheCounts thread_gemm_cache_counts() { return thread_gemm_cache().counts(); }

namespace {

void run_gemm(const Launch& l, const Gemm& g) {
  const GemmPlan& p = g.plan;
  for (auto [v, what] : {std::pair{p.m, "N"},
                         {p.n, "M"},
                         {p.k, "K"},
                         {p.A.ld, "a leading dim"},
                         {p.B.ld, "a leading dim"},
                         {p.ldd, "the output's leading dim"},
                         {p.batch, "the batch count"}}) {
    check_int32(v, what);
  }
  const int dev = l.device;
  const bool tf32 = g.ab_dtype == DType::kF32 && matmul_allow_tf32();
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType ab_type = cuda_type(g.ab_dtype), d_type = cuda_type(g.d_dtype);
  const int32_t batch = static_cast<int32_t>(p.batch);
  const size_t ab_size = dtype_size(g.ab_dtype), d_size = dtype_size(g.d_dtype);

  const cublasOperation_t op_a = p.A.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.B.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue =
      g.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  const uint32_t align_a = alignment(g.a, batch > 1 ? p.stride_a * int64_t(ab_size) : 0);
  const uint32_t align_b = alignment(g.b, batch > 1 ? p.stride_b * int64_t(ab_size) : 0);
  const uint32_t align_d = alignment(g.d, batch > 1 ? p.stride_d * int64_t(d_size) : 0);
  const uint32_t align_bias = g.bias != nullptr ? alignment(g.bias, 0) : 256;

  DeviceLt& lt = device_lt(dev);
  GemmKey key = gemm_key(p, {.device = dev,
                             .ab_dtype = g.ab_dtype,
                             .d_dtype = g.d_dtype,
                             .tf32 = tf32,
                             .epilogue = static_cast<int>(epilogue),
                             .bias_dtype = g.bias_dtype,
                             .align_a = align_a,
                             .align_b = align_b,
                             .align_d = align_d,
                             .align_bias = align_bias});
  auto& cache = thread_gemm_cache();
  GemmSetup* setup = nullptr;
  if (auto* cached = cache.find(key)) {
    setup = cached->get();
  } else {
    auto made = std::make_unique<GemmSetup>(compute, ab_type, d_type, p, dev);
    MatmulDesc& desc = made->desc;
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_a, dev);
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_b, dev);
    if (g.bias != nullptr) {
      desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, dev);
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(g.bias_dtype), dev);
    }
    Preference pref(dev);
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kMaxWorkspaceBytes, dev);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a, dev);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b, dev);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d, dev);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d, dev);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check_cublas(cublasLtMatmulAlgoGetHeuristic(lt.handle(), desc.get(), made->la.get(),
                                                made->lb.get(), made->ld.get(), made->ld.get(),
                                                pref.get(), 1, &result, &found),
                 "cublasLtMatmulAlgoGetHeuristic", dev);
    TESSEL_CHECK(found > 0, NotImplemented,
                 "matmul: cuBLASLt has no algorithm for {} x {} -> {} with m={} n={} k={} "
                 "batch={} (operand alignment {}/{}/{} bytes)",
                 dtype_name(g.ab_dtype), dtype_name(g.ab_dtype), dtype_name(g.d_dtype), p.m, p.n,
                 p.k, p.batch, align_a, align_b, align_d);
    made->algo = result.algo;
    made->workspace = result.workspaceSize;
    setup = cache.insert(std::move(key), std::move(made)).get();
  }
  // The one attribute that changes between calls of one problem.
  if (g.bias != nullptr) setup->desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias, dev);
  // The workspace comes from the caching allocator for this stream and goes back after the
  // call: later work on the stream is ordered after the GEMM, so reuse is safe.
  const Scratch workspace(static_cast<int64_t>(setup->workspace), Device::cuda(dev));
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasLtMatmul(lt.handle(), setup->desc.get(), &alpha, g.a, setup->la.get(), g.b,
                              setup->lb.get(), &beta, g.d, setup->ld.get(), g.d, setup->ld.get(),
                              &setup->algo, workspace.get(), setup->workspace, l.stream),
               "cublasLtMatmul", dev);
}

void matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& bias) {
  if (out.numel() == 0) return;
  const DType ab = a.dtype();
  TESSEL_CHECK(b.dtype() == ab && (out.dtype() == ab || out.dtype() == DType::kF32), Internal,
               "matmul: operands {} and {} into {}", dtype_name(ab), dtype_name(b.dtype()),
               dtype_name(out.dtype()));
  DeviceScope s(out.device());
  if (a.size(-1) == 0) {  // an empty sum: zeros (every floating dtype's zero is all-zero bits)
    check_cuda(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), s.launch.stream), "cudaMemsetAsync",
               s.launch.device);
    return;
  }
  Gemm g;
  g.ab_dtype = ab;
  g.d_dtype = out.dtype();
  g.plan = plan_gemm(a, b, out);
  if (g.plan.dense) {
    // Batch dims no single stride describes (heads of a (B, T, H, D) view, say) would take one
    // call per outer index; a copy of each operand in out's batch layout costs less.
    auto dense = [&](const Tensor& t) {
      const Tensor view = batch_expanded(t, out);
      Tensor copy = empty(view.shape(), t.dtype(), t.device());
      cuda_backend().copy(view, copy);
      return copy;
    };
    matmul_impl(dense(a), dense(b), out, bias);
    return;
  }
  g.a = b.data_ptr();  // cuBLASLt's A is our b
  g.b = a.data_ptr();
  g.d = out.data_ptr();
  if (bias.defined()) {
    g.bias = bias.data_ptr();
    g.bias_dtype = bias.dtype();
  }
  run_gemm(s.launch, g);
}

}  // namespace

void CudaBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  matmul_impl(a, b, out, Tensor());
}

void CudaBackend::addmm(const Tensor& bias, const Tensor& a, const Tensor& b, const Tensor& out) {
  TESSEL_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && bias.dim() == 1 &&
                   bias.size(0) == out.size(1) && bias.is_contiguous() &&
                   (bias.dtype() == out.dtype() || bias.dtype() == DType::kF32),
               Internal, "addmm: bias {} for output {}", bias.str(), out.str());
  if (out.numel() != 0 && a.size(-1) == 0) {  // out = bias on every row (as the CPU's)
    copy(bias.as_strided(out.shape(), {0, 1}, bias.offset()), out);
    return;
  }
  matmul_impl(a, b, out, bias);
}

}  // namespace tessel::cuda
