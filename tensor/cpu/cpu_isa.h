#pragma once
// Private: TESSEL_ISA_CLONES compiles a function three times — AVX-512 (x86-64-v4), AVX2+FMA
// (x86-64-v3) and baseline x86-64 — and picks the best one the CPU supports when the library
// loads (GCC target_clones, resolved through IFUNC). For plain loops the compiler vectorises.

// Clones are resolved through IFUNC at load time, before a sanitizer runtime is ready (the
// instrumented resolver crashes), so sanitizer builds get the baseline code only.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TESSEL_ISA_CLONES
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TESSEL_ISA_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TESSEL_ISA_CLONES
#endif
