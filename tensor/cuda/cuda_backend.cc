// The CUDA backend's host code for copies between devices, copy/convert, fill, arange,
// random, unary, binary and where; the backend's registration; the public cuda.h functions.
#include "tessel/tensor/cuda/cuda_backend.h"

#include <atomic>
#include <cstring>

#include "tessel/base/error.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/cuda/cuda_builtin.h"
#include "tessel/tensor/cuda/cuda_runtime.h"

namespace tessel::cuda {

CudaBackend& cuda_backend() {
  static CudaBackend* backend = new CudaBackend;  // never destroyed, like the runtime
  return *backend;
}

Backend* builtin_backend() { return &cuda_backend(); }

// ---- cuda.h -------------------------------------------------------------------------------------

namespace {
std::atomic<bool> g_allow_tf32{false};
}  // namespace

bool is_built() { return true; }
int device_count() { return cuda_runtime().device_count(); }
std::string unavailable_reason() { return cuda_runtime().unavailable_reason(); }
std::string device_name(int index) { return cuda_runtime().device_name(index); }
void set_device(int index) {
  const int count = device_count();
  if (index < 0 || index >= count) {
    throw Unavailable(
        fmt::format("device cuda:{} is not available: the process sees {} CUDA "
                    "device(s){}{}",
                    index, count, count == 0 ? ": " : "", count == 0 ? unavailable_reason() : ""));
  }
  check_cuda(cudaSetDevice(index), "cudaSetDevice", index);
}
void set_matmul_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool matmul_allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

// ---- Copies between devices ---------------------------------------------------------------------

namespace {

cudaStream_t native(const Stream& s) { return static_cast<cudaStream_t>(s.native_handle()); }

// Waits for `stream` (the copy's) and reports errors kernels recorded meanwhile.
void finish(const Stream& stream) { cuda_runtime().synchronize_stream(stream); }

}  // namespace

void CudaBackend::copy_device(const Tensor& src, const Tensor& dst, bool non_blocking) {
  const size_t bytes = src.nbytes();
  TESSEL_CHECK(bytes == dst.nbytes() && src.is_contiguous() && dst.is_contiguous(), Internal,
               "copy_device needs two contiguous tensors of one size, got {} and {}", src.str(),
               dst.str());
  if (bytes == 0) return;
  const Device sd = src.device(), dd = dst.device();
  if (sd.is_cuda() && dd.is_cuda()) {
    if (sd == dd) {
      const Stream stream = current_stream(dd);
      DeviceGuard guard(dd.index);
      check_cuda(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToDevice,
                                 native(stream)),
                 "cudaMemcpyAsync (device to device)", dd.index);
      if (!non_blocking) finish(stream);
      return;
    }
    // Between devices: on the source's stream, after the destination's stream reached the
    // copy (its memory is free to overwrite) and before its later work.
    const Stream src_stream = current_stream(sd), dst_stream = current_stream(dd);
    Event dst_ready(dd);
    dst_ready.record(dst_stream);
    src_stream.wait(dst_ready);
    {
      DeviceGuard guard(sd.index);
      check_cuda(cudaMemcpyPeerAsync(dst.data_ptr(), dd.index, src.data_ptr(), sd.index, bytes,
                                     native(src_stream)),
                 "cudaMemcpyPeerAsync", sd.index);
    }
    Event copied(sd);
    copied.record(src_stream);
    dst_stream.wait(copied);
    if (!non_blocking) finish(src_stream);
    return;
  }
  if (dd.is_cuda()) {  // host to device
    TESSEL_CHECK(sd.is_cpu(), Internal, "copy_device from {} to {}", sd.str(), dd.str());
    const Stream stream = current_stream(dd);
    DeviceGuard guard(dd.index);
    check_cuda(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyHostToDevice,
                               native(stream)),
               "cudaMemcpyAsync (host to device)", dd.index);
    if (non_blocking && src.is_pinned()) {
      src.storage().record_stream(stream);  // the host memory is not reused before the copy
    } else {
      finish(stream);
    }
    return;
  }
  TESSEL_CHECK(sd.is_cuda() && dd.is_cpu(), Internal, "copy_device from {} to {}", sd.str(),
               dd.str());
  const Stream stream = current_stream(sd);
  DeviceGuard guard(sd.index);
  check_cuda(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToHost,
                             native(stream)),
             "cudaMemcpyAsync (device to host)", sd.index);
  if (non_blocking && dst.is_pinned()) {
    dst.storage().record_stream(stream);
  } else {
    finish(stream);
  }
}

// ---- Elementwise --------------------------------------------------------------------------------

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  DeviceScope s(dst.device());
  launch_copy(s.launch, make_indexer<2>(dst.shape(), {&src.strides(), &dst.strides()}), dst.numel(),
              src.data_ptr(), src.dtype(), dst.data_ptr(), dst.dtype());
}

namespace {

// `value` as dst's dtype stores it (the CPU backend's conversion), as raw bits.
uint64_t element_bits(DType dtype, double value) {
  uint64_t bits = 0;
  auto put = [&bits](auto v) { std::memcpy(&bits, &v, sizeof(v)); };
  switch (dtype) {
    case DType::kF32:
      put(static_cast<float>(value));
      break;
    case DType::kBF16:
      put(BFloat16(static_cast<float>(value)).bits);
      break;
    case DType::kF16:
      put(Half(static_cast<float>(value)).bits);
      break;
    case DType::kI64:
      put(static_cast<int64_t>(value));
      break;
    case DType::kI32:
      put(static_cast<int32_t>(value));
      break;
    case DType::kBool:
      put(static_cast<uint8_t>(value != 0.0));
      break;
  }
  return bits;
}

}  // namespace

void CudaBackend::fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  DeviceScope s(dst.device());
  launch_fill(s.launch, make_indexer<1>(dst.shape(), {&dst.strides()}), dst.numel(), dst.data_ptr(),
              static_cast<int>(dst.element_size()), element_bits(dst.dtype(), value));
}

void CudaBackend::arange(const Tensor& dst, double start, double step) {
  if (dst.numel() == 0) return;
  DeviceScope s(dst.device());
  launch_arange(s.launch, dst.numel(), dst.data_ptr(), dst.dtype(), start, step);
}

void CudaBackend::random(const Tensor& dst, RandomDistribution dist, double a, double b,
                         uint64_t seed, uint64_t offset) {
  TESSEL_CHECK(is_floating(dst.dtype()), InvalidArgument,
               "random needs a floating-point tensor, got {}", dtype_name(dst.dtype()));
  if (dst.numel() == 0) return;
  DeviceScope s(dst.device());
  launch_random(s.launch, dst.numel(), dst.data_ptr(), dst.dtype(), dist, static_cast<float>(a),
                static_cast<float>(b), seed, offset);
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  if (out.numel() == 0) return;
  DeviceScope s(out.device());
  launch_unary(s.launch, op, make_indexer<2>(out.shape(), {&x.strides(), &out.strides()}),
               out.numel(), x.data_ptr(), x.dtype(), out.data_ptr(), out.dtype());
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  DeviceScope s(out.device());
  launch_binary(s.launch, op,
                make_indexer<3>(out.shape(), {&a.strides(), &b.strides(), &out.strides()}),
                out.numel(), a.data_ptr(), b.data_ptr(), a.dtype(), out.data_ptr(), out.dtype());
}

void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  DeviceScope s(out.device());
  launch_where(
      s.launch,
      make_indexer<4>(out.shape(), {&cond.strides(), &a.strides(), &b.strides(), &out.strides()}),
      out.numel(), cond.data_ptr(), a.data_ptr(), b.data_ptr(), out.data_ptr(), out.dtype());
}

}  // namespace tessel::cuda
