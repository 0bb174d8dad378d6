#pragma once
// Private: the CUDA backend's objects for the registries of backend.cc, stream.cc and
// storage.cc, which take them at start-up. In a build without CUDA (cuda_stub.cc) every one
// is null. Each is created on first call and lives until the process exits.

#include "tessel/tensor/backend.h"
#include "tessel/tensor/storage.h"
#include "tessel/tensor/stream.h"

namespace tessel::cuda {

Backend* builtin_backend();
DeviceRuntime* builtin_runtime();
Allocator* builtin_allocator();
// Null also when the process sees no CUDA device (page-locked memory needs a driver).
Allocator* builtin_pinned_allocator();

}  // namespace tessel::cuda
