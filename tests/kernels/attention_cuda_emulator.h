#pragma once
// A host emulation of the primitives in kernels/attention/cuda/internal/warp_primitives.h, so
// the CUDA attention kernels' CTA code runs on the CPU: every CUDA thread of a CTA is a host
// thread; warp-collective operations (ldmatrix, mma, shuffles) exchange operands through the
// warp's slots between two warp barriers. cp.async copies land as late as the PTX memory model
// allows: queued per thread until a cp_async_wait() retires their group, then visible to the
// issuing thread only, and written to shared memory for everyone at that thread's next
// cta_sync() — over anything another thread stored there meanwhile. So another warp reading
// before the barrier sees stale memory, and another warp's store racing the copy is lost,
// deterministically: a missing barrier fails a test instead of passing by luck. Shared memory
// starts filled with 0xA5 bytes. Slow (barriers on every collective): for small shapes only.
//
//   run_grid({gx, gy, gz}, threads, smem_bytes, [&](int bx, int by, int bz, char* smem) {
//     flash_forward_cta<ForwardD64, Elem::kBf16>(params, gx - 1 - bx, by, bz, smem);
//   });

#include <functional>

namespace tessel::kernels::attention::cuda::emulator {

// Runs body once per CTA of the grid, CTAs one after another, each with `threads` host threads
// (a multiple of 32) sharing `smem_bytes` of 128-byte aligned shared memory. Throws
// std::logic_error when a CTA ends with copies still queued.
void run_grid(const int (&grid)[3], int threads, int smem_bytes,
              const std::function<void(int bx, int by, int bz, char* smem)>& body);

}  // namespace tessel::kernels::attention::cuda::emulator
