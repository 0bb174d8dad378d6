#pragma once
// flash_cpu: FlashAttention-2 on the CPU. Exact attention by tiles of (query block x key
// block) with an online softmax: the S_q x S_k score matrix is never formed; forward returns
// the output and the logsumexp, backward recomputes the probabilities from the logsumexp.
// f32 or bf16 inputs, f32 accumulation; AVX-512, AVX2+FMA or scalar kernels chosen at run time.
//
//   AttentionProblem p = ...;                        // see attention_problem.h
//   std::vector<float> lse(B * H * S_q);
//   flash_cpu_forward(p, out_view, lse.data());
//   flash_cpu_backward(p, out_view, dout_view, lse.data(), dq_view, dk_view, dv_view);
//
// Work split: forward runs tasks (batch, query head, query block) with its tiles transposed
// (S^T = K Q^T, O^T = V^T P^T) so that f32 K and V are read in place; backward runs tasks
// (batch, key/value head, key block), each computing its dk/dv block over all query heads of
// its group and adding its dq contributions into a shared f32 accumulator under a per-query-
// block lock, so no phase serializes on heads. Extra memory: per-thread tiles; for bf16 inputs
// converted or paired copies of K and V (forward); for backward an f32 dq accumulator plus two
// floats per query row: O(S * D) per head, never O(S^2).

#include <cstdint>
#include <string_view>

#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels::attention {

enum class CpuIsa : uint8_t { kAuto, kScalar, kAvx2, kAvx512 };

std::string_view cpu_isa_name(CpuIsa isa);  // "auto", "scalar", "avx2", "avx512"
// The best instruction set this CPU supports (never kAuto).
CpuIsa detect_cpu_isa();
bool cpu_isa_supported(CpuIsa isa);

struct FlashCpuOptions {
  CpuIsa isa = CpuIsa::kAuto;  // a set the CPU lacks -> Unavailable
  int threads = 0;             // 0: hardware concurrency
  int block_q = 64;            // query rows per tile (>= 1)
  int block_kv = 64;           // keys per tile (a multiple of 16)
  // bf16 inputs on CPUs with AVX512-BF16: all GEMMs on bf16 pairs (vdpbf16ps) with f32
  // accumulation; P and dS are rounded to bf16 before the GEMMs that consume them, as
  // FlashAttention does on GPUs. false: convert to f32 and use f32 FMAs.
  bool bf16_dot_products = true;
};

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
