#pragma once
// flash_cpu: FlashAttention-2 on the CPU. Exact attention by tiles of (query block x key
// block) with an online softmax: the S_q x S_k score matrix is never formed; forward returns
// the output and the logsumexp, backward recomputes the probabilities from the logsumexp.
// f32 or bf16 inputs, f32 accumulation; AMX (bf16 GEMMs on tiles), AVX-512, AVX2+FMA or scalar
// kernels chosen at run time.
//
//   AttentionProblem p = ...;                        // see attention_problem.h
//   std::vector<float> lse(B * H * S_q);
//   flash_cpu_forward(p, out_view, lse.data());
//   flash_cpu_backward(p, out_view, dout_view, lse.data(), dq_view, dk_view, dv_view);
//
// Work split: forward runs tasks (batch, query head, query block) with its tiles transposed
// (S^T = K Q^T, O^T = V^T P^T) so that f32 K and V are read in place; where a head's K and V
// outgrow the L2 cache a task takes up to four query blocks, which share each key block it
// fetches. Backward runs tasks (batch, key/value head, key block), each computing its dk/dv
// block over all query heads of its group and adding its dq contributions into a shared f32
// accumulator under a per-query-block lock, so no phase serializes on heads. Extra memory:
// per-thread tiles; for bf16 inputs converted or paired copies of K and V (forward); for
// backward an f32 dq accumulator plus two floats per query row: O(S * D) per head, never
// O(S^2).

#include <cstdint>
#include <string_view>

#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels::attention {

// Instruction sets of the tile kernels. kAmx is AVX-512 plus AMX tiles for the GEMMs of bf16
// inputs (f32 inputs run the AVX-512 kernels under it); it counts as supported only where the
// CPU reports amx_tile, amx_bf16 and avx512_bf16 and the kernel grants this process the tile
// state (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once).
enum class CpuIsa : uint8_t { kAuto, kScalar, kAvx2, kAvx512, kAmx };

std::string_view cpu_isa_name(CpuIsa isa);  // "auto", "scalar", "avx2", "avx512", "amx"
// The best instruction set this CPU supports (never kAuto).
CpuIsa detect_cpu_isa();
bool cpu_isa_supported(CpuIsa isa);

struct FlashCpuOptions {
  CpuIsa isa = CpuIsa::kAuto;  // a set the CPU lacks -> Unavailable
  int threads = 0;             // 0: hardware concurrency
  int block_q = 64;            // query rows per tile (>= 1)
  // Keys per tile (a multiple of 16); 0: 64, or 128 for bf16 on AMX (where a wider tile
  // amortises the load and store of the output accumulator).
  int block_kv = 0;
  // bf16 inputs on CPUs with AVX512-BF16: all GEMMs on bf16 pairs (AMX tiles with kAmx when
  // block_q and block_kv are multiples of 32, else vdpbf16ps) with f32 accumulation; P and dS
  // are rounded to bf16 before the GEMMs that consume them, as FlashAttention does on GPUs.
  // false: convert to f32 and use f32 FMAs.
  bool bf16_dot_products = true;
};

// The kernels a call with these inputs and options runs, for logs and benchmarks: "amx-bf16",
// "avx512-bf16", "avx512", "avx2" or "scalar" (f32 FMAs). Throws as flash_cpu_forward for an
// unsupported isa.
std::string_view flash_cpu_kernel_name(DType dtype, const FlashCpuOptions& options = {});

// out (like q) = attention; lse (contiguous (B, H_q, S_q), natural log, -inf for rows that see
// no key) unless null. Blocking. Throws InvalidArgument for a bad problem, output or option,
// Unavailable for an unsupported isa.
void flash_cpu_forward(const AttentionProblem& problem, const AttentionView& out, float* lse,
                       const FlashCpuOptions& options = {});

// dq, dk, dv for output gradient dout, given forward's out and lse for the same problem
// (same dropout seed/offset: the mask is regenerated). Blocking; throws as forward.
void flash_cpu_backward(const AttentionProblem& problem, const AttentionView& out,
                        const AttentionView& dout, const float* lse, const AttentionView& dq,
                        const AttentionView& dk, const AttentionView& dv,
                        const FlashCpuOptions& options = {});

}  // namespace tessel::kernels::attention
