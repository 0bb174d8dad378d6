#pragma once
// One attention call described over raw memory: (B, H, S, D) views with element strides, the
// mask (causal with alignment, sliding window, prefix-LM, documents, a predicate), scale and
// dropout. Every backend (math reference, flash_cpu, later CUDA) consumes this description.
//
//   AttentionProblem p;
//   p.q = attention_view(q_ptr, DType::kF32, {B, H, S, D});   // contiguous (B, H, S, D)
//   p.k = ...; p.v = ...;
//   p.mask.causal = true;
//   validate_attention_problem(p);                          // throws InvalidArgument

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessel/tensor/device.h"
#include "tessel/tensor/dtype.h"

namespace tessel::kernels::attention {

// Where query row i sits among the keys when S_q != S_k. Top-left: query i is at key position i
// (PyTorch's is_causal). Bottom-right: the last query aligns with the last key, query i is at
// key position i + S_k - S_q (FlashAttention's causal, KV-cache decoding).
enum class MaskAlignment : uint8_t { kTopLeft, kBottomRight };

// A FlexAttention-style mask predicate: true when query q_index of (batch, head) may attend to
// key kv_index. Must be pure and thread-safe (it is called from many threads, in any order).
using MaskFn = std::function<bool(int64_t batch, int64_t head, int64_t q_index, int64_t kv_index)>;

// What each query may see. The built-in parts combine as
//   visible = (window_ok(i, j) || j < prefix_length[b]) && same_document(b, i, j) && mask_fn(...)
// where window_ok applies causal (right window 0) and the left/right windows at the aligned
// query position. A query row that sees nothing yields output 0 and logsumexp -inf.
struct AttentionMask {
  bool causal = false;
  MaskAlignment alignment = MaskAlignment::kTopLeft;
  // Sliding window, in keys before (left) and after (right) the aligned query position;
  // -1 means unbounded. Window (w, 0) is causal local attention.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Prefix-LM: keys below the prefix length are visible to every query of the batch entry.
  // Empty: no prefix; one value: every batch entry; B values: one per batch entry.
  std::vector<int64_t> prefix_lengths;
  // Document masking: a query sees only keys of its own document. Row-major (B, S_q) and
  // (B, S_k) ids, or (S_q) / (S_k) shared by every batch entry. kv ids may be left empty when
  // S_q == S_k to reuse the query ids.
  std::vector<int64_t> q_document_ids;
  std::vector<int64_t> kv_document_ids;
  MaskFn mask_fn;

  bool has_documents() const { return !q_document_ids.empty(); }
  // True when no part restricts visibility (plain bidirectional attention).
  bool is_dense() const {
    return !causal && window_left < 0 && window_right < 0 && !has_documents() && !mask_fn;
  }
};

// A (B, H, S, D) view of memory: sizes and element strides. No ownership. dtype f32, bf16 or
// f16 (the CPU backends take f32 and bf16; f16 is for the CUDA ones and the math reference).
struct AttentionView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::cpu();
  int64_t sizes[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};

  int64_t batch() const { return sizes[0]; }
  int64_t heads() const { return sizes[1]; }
  int64_t seq() const { return sizes[2]; }
  int64_t head_dim() const { return sizes[3]; }
  int64_t offset(int64_t b, int64_t h, int64_t s, int64_t d) const {
    return b * strides[0] + h * strides[1] + s * strides[2] + d * strides[3];
  }
};

// A contiguous row-major view of `data` with the given (B, H, S, D) sizes.
AttentionView attention_view(void* data, DType dtype, const int64_t (&sizes)[4]);
AttentionView attention_view(const void* data, DType dtype, const int64_t (&sizes)[4]);

// Dropout on the attention probabilities: element (b, h, i, j) is kept with probability
// 1 - p and scaled by 1 / (1 - p); the keep decision is a pure function of
// (seed, offset, b, h, i, j) so backward regenerates forward's mask.
struct AttentionDropout {
  double p = 0.0;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

struct AttentionProblem {
  AttentionView q, k, v;  // q: (B, H_q, S_q, D); k, v: (B, H_kv, S_k, D), H_q % H_kv == 0
  AttentionMask mask;
  std::optional<double> scale;  // default 1 / sqrt(D)
  AttentionDropout dropout;
  // Backward: bitwise-reproducible gradients (GPU backends then avoid order-dependent atomics;
  // flash_cuda computes dQ in its own kernel, cudnn picks its deterministic algorithm).
  bool deterministic = false;

  int64_t batch() const { return q.batch(); }
  int64_t q_heads() const { return q.heads(); }
  int64_t kv_heads() const { return k.heads(); }
  int64_t q_len() const { return q.seq(); }
  int64_t kv_len() const { return k.seq(); }
  int64_t head_dim() const { return q.head_dim(); }
  double softmax_scale() const;
};

// Checks shapes, dtypes (f32, bf16 or f16, all equal), devices (all CPU-side memory the same
// device), head counts (H_q a multiple of H_kv), head dims, windows (-1 or >= 0), prefix
// lengths (size 0, 1 or B, values >= 0), document-id lengths and dropout p in [0, 1).
// Throws InvalidArgument naming the bad value and the expected one.
void validate_attention_problem(const AttentionProblem& problem);

// Checks that `view` has the sizes and device that `like` has; `what` names it in errors.
void validate_attention_output(const AttentionView& view, const AttentionView& like,
                               const char* what);

}  // namespace tessel::kernels::attention
