// Whether this process may run AMX instructions: the CPU must report them (CPUID) and, on
// Linux, the kernel must grant the process the tile data state, which it enables only on
// request (the state is 8 KiB per thread, saved on every context switch). Compiled with the
// baseline flags: it runs before anything knows what the CPU supports.
#include <sys/syscall.h>
#include <unistd.h>

#include "tessel/kernels/attention/cpu/internal/tile_ops.h"

namespace tessel::kernels::attention::internal {
namespace {

// From the Linux uapi (asm/prctl.h, asm/fpu/xstate.h); older headers lack them.
constexpr long kArchGetXcompPerm = 0x1022;
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

bool request_tile_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long features = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &features) != 0) return false;
  return (features >> kXfeatureXtiledata) & 1;
#else
  return false;
#endif
}

}  // namespace

bool amx_tiles_usable() {
  static const bool usable =
      __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && request_tile_permission();
  return usable;
}

}  // namespace tessel::kernels::attention::internal
