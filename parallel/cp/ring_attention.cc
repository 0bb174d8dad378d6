#include "tessel/parallel/cp/ring_attention.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::parallel {
namespace {

using kernels::attention::AttentionProblem;
using kernels::attention::AttentionView;

constexpr int kRingTag = 7301;  // p2p tag of the ring's K/V (and dK/dV) messages
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// How the causal mask treats one (query segment, key segment) block.
enum class BlockKind : uint8_t { kSkip, kFull, kDiagonal };

BlockKind classify(const CpSegment& qs, const CpSegment& ks, bool causal) {
  if (!causal) return BlockKind::kFull;
  if (ks.start >= qs.start + qs.length) return BlockKind::kSkip;  // every key after every query
  if (ks.start + ks.length - 1 <= qs.start) return BlockKind::kFull;
  // Segments of a layout partition the sequence, so overlapping ones are the same segment.
  TESSEL_CHECK(ks.start == qs.start && ks.length == qs.length, Internal,
               "ring_attention: query segment [{}, +{}) partly overlaps key segment [{}, +{})",
               qs.start, qs.length, ks.start, ks.length);
  return BlockKind::kDiagonal;
}

// Visible (query, key) pairs of one block, per (batch, head).
int64_t visible_pairs(BlockKind kind, const CpSegment& qs, const CpSegment& ks) {
  if (kind == BlockKind::kSkip) return 0;
  if (kind == BlockKind::kFull) return qs.length * ks.length;
  return qs.length * (qs.length + 1) / 2;
}

// Rows [start, start + length) along S of a contiguous (..., S, D) tensor `t` seen as 4-D
// (lead0, lead1, S, D) with the given leading offset in elements.
AttentionView rows_view(const Tensor& t, int64_t element_offset, int64_t b, int64_t h, int64_t s,
                        int64_t d, int64_t start, int64_t length) {
  AttentionView v;
  v.data = t.data<float>() + element_offset + start * d;
  v.dtype = DType::kF32;
  v.device = t.device();
  const int64_t sizes[4] = {b, h, length, d};
  const int64_t strides[4] = {h * s * d, s * d, d, 1};
  for (int i = 0; i < 4; ++i) {
    v.sizes[i] = sizes[i];
    v.strides[i] = strides[i];
  }
  return v;
}

// The shapes of one call, named once.
struct Dims {
  int64_t B = 0, Hq = 0, Hkv = 0, D = 0;
};

// Per-rank state shared by forward and backward.
struct RingState {
  ProcessGroup* group = nullptr;
  CpLayout layout;
  RingAttentionOptions options;
  Dims dims;
  RingAttentionStats stats;
};

AttentionProblem block_problem(const RingState& st, const AttentionView& q, const AttentionView& k,
                               const AttentionView& v, BlockKind kind) {
  AttentionProblem p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.scale = st.options.scale;
  p.mask.causal = kind == BlockKind::kDiagonal;
  return p;
}

const kernels::SdpaKernel& kernel_for(const RingState& st, const AttentionProblem& p) {
  const kernels::SdpaBackend* forced = st.options.backend ? &*st.options.backend : nullptr;
  return kernels::select_sdpa_backend(p, forced);
}

// Sends `out` to the next rank and receives `in` from the previous one. Even ranks issue the
// send first and odd ranks the receive, so backends whose sends wait for the receiver do not
// deadlock. Returns the two asynchronous operations.
std::vector<Work> ring_shift(ProcessGroup& group, const Tensor& out, Tensor& in) {
  const int n = group.size(), r = group.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<Work> works;
  if (r % 2 == 0) {
    works.push_back(group.send(out, next, {.tag = kRingTag, .async = true}));
    works.push_back(group.recv(in, prev, {.tag = kRingTag, .async = true}));
  } else {
    works.push_back(group.recv(in, prev, {.tag = kRingTag, .async = true}));
    works.push_back(group.send(out, next, {.tag = kRingTag, .async = true}));
  }
  return works;
}

void wait_all(std::vector<Work>& works) {
  for (Work& w : works) w.wait();
  works.clear();
}

// Merges a block's (out, lse) for query rows [q_off, q_off + len) into the running ones:
// lse = log(e^lse_acc + e^lse_blk), out = e^(lse_acc - lse) out_acc + e^(lse_blk - lse) out_blk.
void merge_block(const Dims& d, int64_t s_local, int64_t q_off, int64_t len, const float* blk_out,
                 const float* blk_lse, float* acc_out, float* acc_lse) {
  for (int64_t bh = 0; bh < d.B * d.Hq; ++bh) {
    for (int64_t i = 0; i < len; ++i) {
      const float lb = blk_lse[bh * len + i];
      if (lb == kNegInf) continue;  // the block shows this row nothing
      float& la = acc_lse[bh * s_local + q_off + i];
      const float m = std::max(la, lb);
      const float wa = la == kNegInf ? 0.0f : std::exp(la - m);
      const float wb = std::exp(lb - m);
      const float sum = wa + wb;
      float* o = acc_out + (bh * s_local + q_off + i) * d.D;
      const float* ob = blk_out + (bh * len + i) * d.D;
      const float ca = wa / sum, cb = wb / sum;
      for (int64_t x = 0; x < d.D; ++x) o[x] = ca * o[x] + cb * ob[x];
      la = m + std::log(sum);
    }
  }
}

// K and V of one rank packed as (2, B, H_kv, S, D), the unit that travels around the ring.
Tensor pack_kv(const Tensor& k, const Tensor& v) { return contiguous(stack({k, v}, 0)); }

std::vector<Tensor> ring_forward(RingState& st, const Tensor& q, const Tensor& k, const Tensor& v) {
  ProcessGroup& group = *st.group;
  const Dims& d = st.dims;
  const int n = group.size(), r = group.rank();
  const int64_t s_local = st.layout.local_len(r);
  Tensor out = zeros({d.B, d.Hq, s_local, d.D}, DType::kF32);
  Tensor lse = full({d.B, d.Hq, s_local}, -std::numeric_limits<double>::infinity(), DType::kF32);
  Tensor kv = pack_kv(k, v);
  st.stats = {};
  for (int step = 0; step < n; ++step) {
    const int owner = (r - step + n) % n;
    const int64_t s_kv = st.layout.local_len(owner);
    std::vector<Work> pending;
    Tensor next_kv;
    if (step + 1 < n) {  // start the next block's transfer before computing on this one
      next_kv = empty({2, d.B, d.Hkv, st.layout.local_len((owner + n - 1) % n), d.D}, DType::kF32);
      pending = ring_shift(group, kv, next_kv);
    }
    const int64_t v_off = d.B * d.Hkv * s_kv * d.D;
    int64_t q_off = 0;
    for (const CpSegment& qs : st.layout.ranks[static_cast<size_t>(r)]) {
      int64_t k_off = 0;
      for (const CpSegment& ks : st.layout.ranks[static_cast<size_t>(owner)]) {
        const BlockKind kind = classify(qs, ks, st.options.causal);
        if (kind == BlockKind::kSkip) {
          ++st.stats.blocks_skipped;
        } else {
          ++st.stats.blocks_computed;
          if (kind == BlockKind::kDiagonal) ++st.stats.blocks_masked;
          st.stats.scores += visible_pairs(kind, qs, ks) * d.B * d.Hq;
          const AttentionProblem p =
              block_problem(st, rows_view(q, 0, d.B, d.Hq, s_local, d.D, q_off, qs.length),
                            rows_view(kv, 0, d.B, d.Hkv, s_kv, d.D, k_off, ks.length),
                            rows_view(kv, v_off, d.B, d.Hkv, s_kv, d.D, k_off, ks.length), kind);
          Tensor blk_out = empty({d.B, d.Hq, qs.length, d.D}, DType::kF32);
          Tensor blk_lse = empty({d.B, d.Hq, qs.length}, DType::kF32);
          kernel_for(st, p).forward(p, kernels::attention_view_of(blk_out, "block out"),
                                    blk_lse.data<float>());
          merge_block(d, s_local, q_off, qs.length, blk_out.data<float>(), blk_lse.data<float>(),
                      out.data<float>(), lse.data<float>());
        }
        k_off += ks.length;
      }
      q_off += qs.length;
    }
    wait_all(pending);
    if (step + 1 < n) kv = next_kv;
  }
  return {out, lse};
}

// Rows [start, start + length) of a contiguous (B, H, S) f32 tensor, copied contiguous.
Tensor lse_rows(const Tensor& lse, int64_t start, int64_t length) {
  return contiguous(narrow(lse, 2, start, length));
}

std::vector<Tensor> ring_backward(RingState& st, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout) {
  ProcessGroup& group = *st.group;
  const Dims& d = st.dims;
  const int n = group.size(), r = group.rank();
  const int64_t s_local = st.layout.local_len(r);
  Tensor dq = zeros({d.B, d.Hq, s_local, d.D}, DType::kF32);
  // The travelling unit: K, V, dK, dV of one owner, (4, B, H_kv, S, D).
  Tensor unit = contiguous(stack({k, v, zeros_like(k), zeros_like(v)}, 0));
  for (int step = 0; step < n; ++step) {
    const int owner = (r - step + n) % n;
    const int64_t s_kv = st.layout.local_len(owner);
    const int64_t plane = d.B * d.Hkv * s_kv * d.D;
    float* dk_acc = unit.data<float>() + 2 * plane;
    float* dv_acc = unit.data<float>() + 3 * plane;
    int64_t q_off = 0;
    for (const CpSegment& qs : st.layout.ranks[static_cast<size_t>(r)]) {
      Tensor seg_lse = lse_rows(lse, q_off, qs.length);
      int64_t k_off = 0;
      for (const CpSegment& ks : st.layout.ranks[static_cast<size_t>(owner)]) {
        const BlockKind kind = classify(qs, ks, st.options.causal);
        if (kind != BlockKind::kSkip) {
          const AttentionProblem p =
              block_problem(st, rows_view(q, 0, d.B, d.Hq, s_local, d.D, q_off, qs.length),
                            rows_view(unit, 0, d.B, d.Hkv, s_kv, d.D, k_off, ks.length),
                            rows_view(unit, plane, d.B, d.Hkv, s_kv, d.D, k_off, ks.length), kind);
          Tensor dq_blk = empty({d.B, d.Hq, qs.length, d.D}, DType::kF32);
          Tensor dk_blk = empty({d.B, d.Hkv, ks.length, d.D}, DType::kF32);
          Tensor dv_blk = empty({d.B, d.Hkv, ks.length, d.D}, DType::kF32);
          kernel_for(st, p).backward(
              p, rows_view(out, 0, d.B, d.Hq, s_local, d.D, q_off, qs.length),
              rows_view(dout, 0, d.B, d.Hq, s_local, d.D, q_off, qs.length), seg_lse.data<float>(),
              kernels::attention_view_of(dq_blk, "dq"), kernels::attention_view_of(dk_blk, "dk"),
              kernels::attention_view_of(dv_blk, "dv"));
          add_(narrow(dq, 2, q_off, qs.length), dq_blk);
          // Accumulate the block's dK/dV into the owner's rows [k_off, k_off + len).
          const float* dkb = dk_blk.data<float>();
          const float* dvb = dv_blk.data<float>();
          for (int64_t bh = 0; bh < d.B * d.Hkv; ++bh) {
            for (int64_t j = 0; j < ks.length * d.D; ++j) {
              dk_acc[(bh * s_kv + k_off) * d.D + j] += dkb[bh * ks.length * d.D + j];
              dv_acc[(bh * s_kv + k_off) * d.D + j] += dvb[bh * ks.length * d.D + j];
            }
          }
        }
        k_off += ks.length;
      }
      q_off += qs.length;
    }
    if (n == 1) break;
    // After the last step the block goes one hop further: home to its owner (r + 1).
    Tensor next =
        empty({4, d.B, d.Hkv, st.layout.local_len((owner + n - 1) % n), d.D}, DType::kF32);
    std::vector<Work> pending = ring_shift(group, unit, next);
    wait_all(pending);
    unit = next;
  }
  // `unit` is now this rank's own block with every rank's contribution.
  Tensor dk = contiguous(select(unit, 0, 2));
  Tensor dv = contiguous(select(unit, 0, 3));
  return {dq, dk, dv};
}

}  // namespace

RingAttentionOutput ring_attention(ProcessGroup& group, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const CpLayout& layout,
                                   const RingAttentionOptions& options) {
  TESSEL_CHECK(layout.cp() == group.size(), InvalidArgument,
               "ring_attention: the layout has {} ranks but the cp group has {}", layout.cp(),
               group.size());
  for (const Tensor* t : {&q, &k, &v}) {
    TESSEL_CHECK(t->dim() == 4 && t->dtype() == DType::kF32 && t->device().is_cpu(),
                 InvalidArgument,
                 "ring_attention: q, k, v must be 4-D (B, H, S, D) f32 CPU tensors; got {} {}",
                 shape_str(t->shape()), dtype_name(t->dtype()));
  }
  const int64_t s_local = layout.local_len(group.rank());
  TESSEL_CHECK(q.size(2) == s_local && k.size(2) == s_local && v.size(2) == s_local,
               InvalidArgument,
               "ring_attention: rank {} holds {} tokens of the layout; q, k, v have {}, {}, {}",
               group.rank(), s_local, q.size(2), k.size(2), v.size(2));
  TESSEL_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3) && k.shape() == v.shape() &&
                   k.size(1) > 0 && q.size(1) % k.size(1) == 0,
               InvalidArgument,
               "ring_attention: q {} and k/v {} / {}: expected equal B and D, H_q a multiple of "
               "H_kv",
               shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  auto state = std::make_shared<RingState>();
  state->group = &group;
  state->layout = layout;
  state->options = options;
  state->dims = {q.size(0), q.size(1), k.size(1), q.size(3)};

  auto forward = [state](FunctionContext& ctx, const std::vector<Tensor>& in) {
    const Tensor q_c = contiguous(in[0]), k_c = contiguous(in[1]), v_c = contiguous(in[2]);
    std::vector<Tensor> outs = ring_forward(*state, q_c, k_c, v_c);
    ctx.save_for_backward({q_c, k_c, v_c, outs[0], outs[1]});
    return outs;
  };
  auto backward = [state](FunctionContext& ctx, const std::vector<Tensor>& grads) {
    const std::vector<Tensor>& s = ctx.saved_tensors();
    Tensor dout = grads[0].defined() ? contiguous(to(grads[0], DType::kF32)) : zeros_like(s[3]);
    return ring_backward(*state, s[0], s[1], s[2], s[3], s[4], dout);
  };
  std::vector<Tensor> outs = apply_function("ring_attention", {q, k, v}, forward, backward);
  return {outs[0], outs[1], state->stats};
}

}  // namespace tessel::parallel
