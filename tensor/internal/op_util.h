#pragma once
// Private helpers shared by the ops_*.cc files: dim wrapping and argument checks.

#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/backend.h"
#include "tessel/tensor/tensor.h"

namespace tessel::internal {

// d in [-rank, rank) -> [0, rank); throws OutOfRange naming d and the rank.
inline int64_t wrap_dim(int64_t d, int64_t rank) {
  const int64_t wrapped = d < 0 ? d + rank : d;
  TESSEL_CHECK(wrapped >= 0 && wrapped < rank, OutOfRange,
               "dimension {} is out of range for a tensor with {} dimensions", d, rank);
  return wrapped;
}

inline Backend& backend_of(const Tensor& t) { return backend_for(t.device()); }

// Throws InvalidArgument unless a and b are on one device.
inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.device() == b.device(), InvalidArgument, "{}: tensors on {} and {}", op,
               a.device().str(), b.device().str());
}

// In-place ops are not recorded: refuse targets autograd would need to track.
inline void check_inplace(const char* op, const Tensor& dst) {
  TESSEL_CHECK(!(grad_enabled() && dst.requires_grad()), InvalidArgument,
               "{} on {} which requires a gradient: in-place ops are not recorded by autograd; "
               "run it under NoGradGuard",
               op, dst.str());
}

// t viewed with the given shape through stride-0 broadcasting (shape must be reachable).
inline Tensor broadcast_view(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  const size_t lead = shape.size() - t.shape().size();
  Strides strides(shape.size(), 0);
  for (size_t i = 0; i < t.shape().size(); ++i) {
    strides[lead + i] = t.shape()[i] == shape[lead + i] ? t.strides()[i] : 0;
  }
  return t.as_strided(shape, strides, t.offset());
}

}  // namespace tessel::internal
