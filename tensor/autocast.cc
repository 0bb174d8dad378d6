#include "tessel/tensor/autocast.h"

#include <algorithm>

#include "tessel/base/error.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

// This thread's policy, one slot per device type.
thread_local AutocastGuard::Slot t_policy[kDeviceTypeCount];

void check_dtype(DType dtype, bool enabled) {
  TESSEL_CHECK(!enabled || dtype == DType::kBF16 || dtype == DType::kF16, InvalidArgument,
               "AutocastGuard: dtype {} is not a lower-precision floating type; expected bf16 "
               "or f16",
               dtype_name(dtype));
}

}  // namespace

AutocastGuard::AutocastGuard(DType dtype, bool enabled) {
  check_dtype(dtype, enabled);
  std::copy(std::begin(t_policy), std::end(t_policy), std::begin(previous_));
  for (Slot& slot : t_policy) slot = {enabled, dtype};
}

AutocastGuard::AutocastGuard(DeviceType device_type, DType dtype, bool enabled) {
  check_dtype(dtype, enabled);
  std::copy(std::begin(t_policy), std::end(t_policy), std::begin(previous_));
  t_policy[static_cast<int>(device_type)] = {enabled, dtype};
}

AutocastGuard::~AutocastGuard() {
  std::copy(std::begin(previous_), std::end(previous_), std::begin(t_policy));
}

bool autocast_enabled(DeviceType type) { return t_policy[static_cast<int>(type)].enabled; }

DType autocast_dtype(DeviceType type) { return t_policy[static_cast<int>(type)].dtype; }

Tensor autocast_cast(const Tensor& t, AutocastCategory category) {
  if (!t.defined() || !is_floating(t.dtype())) return t;
  const AutocastGuard::Slot& slot = t_policy[static_cast<int>(t.device().type)];
  if (!slot.enabled) return t;
  const DType want = category == AutocastCategory::kF32 ? DType::kF32 : slot.dtype;
  return t.dtype() == want ? t : to(t, want);
}

}  // namespace tessel
