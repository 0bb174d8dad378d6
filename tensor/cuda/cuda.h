#pragma once
// CUDA in tessel: whether this build and process have it, and its process-wide settings.
// Everything else about CUDA goes through the device-generic API: Device::cuda(i), streams and
// events (stream.h), memory (storage.h: the caching allocator's statistics, empty_cache,
// pinned memory) and ops. In a build without CUDA these functions exist too (a stub): no
// caller needs #ifdef.
//
//   if (cuda::device_count() == 0) fmt::print("no GPU: {}\n", cuda::unavailable_reason());
//   cuda::set_matmul_allow_tf32(true);   // f32 matmuls on TF32 tensor cores

#include <string>

namespace tessel::cuda {

// Whether this build of tessel contains the CUDA backend.
bool is_built();
// CUDA devices this process can use: 0 without the backend, a driver or a device.
int device_count();
// Why device_count() is 0 ("" when it is not).
std::string unavailable_reason();
// The device's name ("NVIDIA H100 80GB HBM3"). Throws Unavailable when it does not exist.
std::string device_name(int index);

// Makes cuda:index the calling thread's current device — call it on the main thread at
// start-up, before any other CUDA work, as a process that owns one GPU (cuda:LOCAL_RANK under a
// launcher; init_process_group does it for a CUDA device). Without it the first CUDA call of
// every rank creates a context on GPU 0. Throws Unavailable when the device does not exist.
void set_device(int index);

// Whether f32 matmuls may run on TF32 tensor cores (inputs rounded to 10-bit mantissas, f32
// accumulation): off by default, like torch.backends.cuda.matmul.allow_tf32. bf16 and f16
// matmuls always use tensor cores with f32 accumulation. Process-wide; thread-safe.
void set_matmul_allow_tf32(bool allow);
bool matmul_allow_tf32();

}  // namespace tessel::cuda
