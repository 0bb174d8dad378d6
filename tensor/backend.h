#pragma once
// Per-device dispatch: the primitive kernels a device backend implements. Ops in ops.h check
// arguments, allocate outputs, record autograd and then call backend_for(device).<kernel>(...).
// The CPU and meta backends are built in; a CUDA backend registers itself with
// register_backend() at start-up, so no op needs to know which devices exist.
//
// Kernel contract (all kernels): arguments were validated by the op; every tensor is on the
// backend's device (copy_device excepted); inputs may be arbitrary strided views (a stride of 0
// broadcasts), outputs are freshly allocated contiguous tensors unless a kernel says otherwise;
// floating-point math on bf16/f16 runs in f32; kernels throw tessel::Error on failure and never
// print. Kernels run on the device's current stream (tensor/stream.h) and never read device
// memory on the host: checks of tensor values (an index out of range) are made by the kernel —
// at once on the CPU, and on devices with asynchronous streams as a device-side error that
// surfaces at the next synchronisation. The meta backend's kernels do nothing (meta tensors
// have shapes, not values).

#include <cstdint>
#include <span>
#include <vector>

#include "tessel/base/reduce_op.h"
#include "tessel/tensor/device.h"
#include "tessel/tensor/tensor.h"

namespace tessel {

enum class UnaryOp : uint8_t {
  kNeg,
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kTanh,
  kRelu,
  kSilu,
  kGelu,
  kGeluTanh,
  kAbs,
  kSigmoid,
  kLogicalNot,
};

enum class BinaryOp : uint8_t {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kMaximum,
  kMinimum,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,  // output bool
  // Backward helpers: (grad, x) -> grad * f'(x).
  kGeluBackward,
  kGeluTanhBackward,
  kSiluBackward,
  kReluBackward,
};

enum class RandomDistribution : uint8_t {
  kUniform,    // uniform in [a, b)
  kNormal,     // mean a, standard deviation b
  kBernoulli,  // b with probability a, else 0 (dropout masks: a = keep, b = 1 / keep)
};

// Hyper-parameters of one fused AdamW step (decoupled weight decay, PyTorch's arithmetic):
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1 for the first update (bias correction)
};

// One parameter's tensors for adamw_step: contiguous f32 tensors of one shape.
struct AdamWTensors {
  Tensor param;  // updated in place
  Tensor grad;
  Tensor exp_avg;     // first moment, updated in place
  Tensor exp_avg_sq;  // second moment, updated in place
};

// The kernels one device type provides. Implementations are stateless or internally
// synchronised: any thread may call any kernel.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType device_type() const = 0;

  // dst[i] = src[i] converted to dst's dtype. Same shapes; dst may be a strided view (not
  // overlapping src).
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  // Copies between devices: one of src and dst is on this backend's device, the other on the
  // CPU (or another device of this type); same shape and dtype, both contiguous. Issued on the
  // current stream of this backend's device. With non_blocking false, or when the host side is
  // not pinned memory, the call returns after the copy is complete; otherwise the copy may still
  // run (order later work with events). The CPU backend copies CPU to CPU.
  virtual void copy_device(const Tensor& src, const Tensor& dst, bool non_blocking) = 0;
  // Every element of dst (any view) = value converted to dst's dtype.
  virtual void fill(const Tensor& dst, double value) = 0;
  // dst[i] = start + i * step (dst contiguous, 1-D).
  virtual void arange(const Tensor& dst, double start, double step) = 0;
  // dst[i] drawn from `dist` at counter offset + i of `seed` (see random.h).
  virtual void random(const Tensor& dst, RandomDistribution dist, double a, double b, uint64_t seed,
                      uint64_t offset) = 0;

  // out = op(x); x has out's shape (maybe broadcast). Floating ops need a floating out.
  virtual void unary(UnaryOp op, const Tensor& x, const Tensor& out) = 0;
  // out = op(a, b); a and b share a dtype and have out's shape (broadcast views). out has that
  // dtype, or bool for comparisons.
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out = cond ? a : b (cond bool; a, b and out one dtype; all out's shape).
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // Reduces x over `dims` (sorted, unique) into out, whose shape is x's with those dims set to
  // 1 (any op of ReduceOp; kAvg divides the sum by the reduced count). out's dtype may differ
  // from x's (an integer sum into i64). The combination order is fixed by the shape alone (never
  // by the thread count), so results are bitwise reproducible. Max/min propagate NaN.
  virtual void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims,
                      const Tensor& out) = 0;
  // out (i64, x's shape with `dim` set to 1) = index of the first largest element along dim
  // (NaN counts as largest). The dim is not empty.
  virtual void argmax(const Tensor& x, int64_t dim, const Tensor& out) = 0;

  // Row-wise over the last dim of a contiguous x: softmax or log_softmax.
  virtual void softmax(const Tensor& x, const Tensor& out, bool log) = 0;
  // grad_x from grad_y and the forward output y (all contiguous, one shape).
  virtual void softmax_backward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x,
                                bool log) = 0;
  // Normalises rows of contiguous x [R, C]; weight/bias [C] may be undefined. mean and rstd
  // are f32 [R] outputs.
  virtual void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                          const Tensor& out, const Tensor& mean, const Tensor& rstd) = 0;
  // grad_weight/grad_bias (f32 [C], overwritten) are undefined when not wanted.
  virtual void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                                   const Tensor& grad_weight, const Tensor& grad_bias) = 0;
  virtual void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out,
                        const Tensor& rstd) = 0;
  virtual void rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                 const Tensor& rstd, const Tensor& grad_x,
                                 const Tensor& grad_weight) = 0;
  // out[i, :] = weight[indices[i], :]; indices i64/i32 contiguous. An index outside [0, V)
  // is an OutOfRange error naming it and its position (see the contract above for when).
  virtual void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) = 0;
  // grad_weight (f32, zeroed by the caller) += scatter of grad rows; deterministic order.
  virtual void embedding_backward(const Tensor& grad, const Tensor& indices,
                                  const Tensor& grad_weight) = 0;
  // Per row n of logits [N, C]: loss[n] = logsumexp - logits[target], 0 where target ==
  // ignore_index; lse[n] saved for backward. loss, lse f32 [N]. A target outside [0, C) that
  // is not ignore_index is an OutOfRange error naming it (see the contract above for when).
  virtual void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                             const Tensor& loss, const Tensor& lse) = 0;
  // grad_logits[n, c] = grad_loss[n] * (softmax[n, c] - [c == target]) (0 on ignored rows).
  virtual void cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits,
                                      const Tensor& target, const Tensor& lse, int64_t ignore_index,
                                      const Tensor& grad_logits) = 0;
  // out[..., M, N] = a[..., M, K] @ b[..., K, N]. a, b and out have the same rank >= 2; batch
  // dims of a and b are equal or 1 (broadcast); each operand's last two dims have one unit
  // stride (row- or column-major); out is contiguous. a and b are both f32 or both bf16 (f16 is
  // converted by the op); out has their dtype, or is f32 for bf16 operands (the f32
  // accumulators written without rounding).
  virtual void matmul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out[M, N] = a[M, K] @ b[K, N] + bias[N] (every row): matmul's contract for 2-D operands,
  // with a contiguous bias of out's dtype or f32 added before out is rounded (the GEMM's
  // epilogue: no pass of its own over out).
  virtual void addmm(const Tensor& bias, const Tensor& a, const Tensor& b, const Tensor& out) = 0;

  // One AdamW update of every entry (the fused multi-tensor step); entries do not overlap.
  // Elements are updated independently, so results do not depend on how work is split.
  virtual void adamw_step(std::span<const AdamWTensors> tensors, const AdamWHyper& hyper) = 0;
};

// The backend for `device`'s type. Throws Unavailable when none is registered.
Backend& backend_for(Device device);
// Registers the backend for every device of `type` (not owned; must outlive its use).
void register_backend(DeviceType type, Backend* backend);

}  // namespace tessel
