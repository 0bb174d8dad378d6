#pragma once
// The oneDNN instruction set a benchmark's header prints (what tessel's CPU GEMMs run on).

#include <dnnl.hpp>

namespace tessel::bench {

// oneDNN's effective CPU ISA by name: "avx512_core_amx (AMX)", "avx512_core_bf16", ...
inline const char* dnnl_isa_name(dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa()) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx (AMX)";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    default:
      return "other";
  }
}

}  // namespace tessel::bench
