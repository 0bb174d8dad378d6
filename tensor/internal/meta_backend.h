#pragma once
// Private: the meta device's backend, whose kernels do nothing (meta tensors have shapes and
// dtypes but no values, so an op on them only computes its output's shape).

#include "tessel/tensor/backend.h"

namespace tessel::internal {

Backend& meta_backend();

}  // namespace tessel::internal
