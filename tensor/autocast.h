#pragma once
// Automatic mixed precision, like torch.autocast: inside an AutocastGuard each listed op picks
// its compute dtype, whatever the dtypes of its inputs; parameters stay as they are (f32 master
// weights, f32 optimizer state) and their gradients come back in their own dtype.
//
//   nn::GPT model(config);                      // f32 parameters
//   Tensor loss;
//   {
//     AutocastGuard autocast(DType::kBF16);     // this thread, this scope
//     loss = nn::GPT::loss(model(tokens), targets);
//   }
//   backward(loss);                             // f32 gradients into the f32 parameters
//   opt.step();
//
// The op lists follow torch.autocast's CPU lists for the ops tessel has:
// - lower precision (floating inputs cast to the autocast dtype; GEMMs accumulate in f32):
//   matmul, bmm, linear, kernels::scaled_dot_product_attention.
// - f32 (16-bit floating inputs cast up to f32): softmax, log_softmax, layer_norm, rms_norm,
//   cross_entropy — the range and accumulation they need is f32's. (cross_entropy's kernels
//   widen 16-bit logits as they read them, which equals casting first, so it skips the cast.)
// - every other op runs in its inputs' dtype with the usual promotion (bf16 + f32 is f32), so a
//   residual stream kept in f32 stays f32, and gelu of a bf16 activation is bf16 (computed in
//   f32, rounded once).
// Casts are ordinary differentiable conversions: the gradient of a bf16 copy of an f32 weight
// is converted back to f32 before it reaches the weight. backward() runs with autocast off;
// each op's backward uses the dtypes its forward saw. Casts are not cached (a tied weight used
// by two lower-precision ops is converted twice). In-place ops are never cast.
//
// Composes with a parameter-dtype policy (FSDP's MixedPrecisionPolicy): autocast only chooses
// compute dtypes, so bf16 parameters make its lower-precision casts no-ops.
//
// Thread-safety: the policy is per thread (a guard affects only ops issued by the thread that
// made it). Guards nest: the innermost decides, and each restores what it found when it ends.

#include <cstdint>

#include "tessel/tensor/device.h"
#include "tessel/tensor/tensor.h"

namespace tessel {

// How an op casts its floating inputs under autocast.
enum class AutocastCategory : uint8_t {
  kLowerPrecision,  // to the autocast dtype (bf16 or f16)
  kF32,             // to f32
};

// Turns autocast on (to `dtype`) or off for ops issued by this thread in its scope, restoring
// the previous policy when it ends. Not copyable or movable; destroy guards in reverse order
// of creation (scopes do).
class AutocastGuard {
 public:
  // For ops on every device type. Throws InvalidArgument when enabled and dtype is not a
  // 16-bit floating type (bf16, f16).
  explicit AutocastGuard(DType dtype = DType::kBF16, bool enabled = true);
  // For ops on devices of `device_type` only (like torch.autocast(device_type, dtype)).
  AutocastGuard(DeviceType device_type, DType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  struct Slot {
    bool enabled = false;
    DType dtype = DType::kBF16;
  };

 private:
  Slot previous_[kDeviceTypeCount];
};

// Whether autocast is on for ops on devices of `type` on this thread, and to which dtype.
bool autocast_enabled(DeviceType type = DeviceType::kCPU);
DType autocast_dtype(DeviceType type = DeviceType::kCPU);

// For op authors: t as an op of `category` must compute it under this thread's policy — t
// itself when autocast is off for t's device, when t is undefined or not floating, or when it
// already has the dtype; else a differentiable conversion of t.
Tensor autocast_cast(const Tensor& t, AutocastCategory category);

}  // namespace tessel
