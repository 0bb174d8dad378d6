#include "tessel/parallel/cp/internal/cp_blocks.h"

#include <cmath>
#include <limits>
#include <unordered_set>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/tensor/ops.h"

namespace tessel::parallel::internal {
namespace {

using kernels::attention::AttentionProblem;
using kernels::attention::AttentionView;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows [start, start + len) of a (B, H, S, D) view.
AttentionView narrow_rows(AttentionView v, int64_t start, int64_t len) {
  v.data =
      static_cast<char*>(v.data) + start * v.strides[2] * static_cast<int64_t>(dtype_size(v.dtype));
  v.sizes[2] = len;
  return v;
}

// Document ids of global positions [start, start + len), every row of the mask's ids.
std::vector<int64_t> doc_slice(const CpMask& m, int64_t start, int64_t len) {
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(m.doc_rows * len));
  for (int64_t b = 0; b < m.doc_rows; ++b) {
    const int64_t* row = m.docs.data() + b * m.seq_len + start;
    ids.insert(ids.end(), row, row + len);
  }
  return ids;
}

// True when some query of [q0, q0 + nq) shares a document with some key of [k0, k0 + nk) (in
// the same row of ids).
bool documents_meet(const CpMask& m, int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  for (int64_t b = 0; b < m.doc_rows; ++b) {
    const int64_t* row = m.docs.data() + b * m.seq_len;
    const std::unordered_set<int64_t> keys(row + k0, row + k0 + nk);
    for (int64_t i = q0; i < q0 + nq; ++i) {
      if (keys.count(row[i]) != 0) return true;
    }
  }
  return false;
}

AttentionProblem block_problem(const BlockContext& c, const BlockPlan& plan, const CpSegment& qs,
                               const CpSegment& ks, const BlockViews& views) {
  AttentionProblem p;
  p.q = narrow_rows(views.q, plan.i0, plan.i1 - plan.i0);
  p.k = narrow_rows(views.k, plan.j0, plan.j1 - plan.j0);
  p.v = narrow_rows(views.v, plan.j0, plan.j1 - plan.j0);
  p.scale = c.options->scale;
  p.mask.window_left = plan.window_left;
  p.mask.window_right = plan.window_right;
  if (c.mask->doc_rows > 0) {
    p.mask.q_document_ids = doc_slice(*c.mask, qs.start + plan.i0, plan.i1 - plan.i0);
    p.mask.kv_document_ids = doc_slice(*c.mask, ks.start + plan.j0, plan.j1 - plan.j0);
  }
  return p;
}

const kernels::SdpaKernel& kernel_for(const BlockContext& c, const AttentionProblem& p) {
  const kernels::SdpaBackend* forced = c.options->backend ? &*c.options->backend : nullptr;
  return kernels::select_sdpa_backend(p, forced);
}

// `t` as f32 (a copy only when it is not f32 already).
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::kF32 ? t : to(t, DType::kF32); }

// acc rows [off, off + len) of a contiguous f32 (BH, S, D) buffer += blk (BH, len, D) f32.
void add_rows(float* acc, int64_t s, int64_t off, const float* blk, int64_t bh_count, int64_t len,
              int64_t d) {
  for (int64_t bh = 0; bh < bh_count; ++bh) {
    float* a = acc + (bh * s + off) * d;
    const float* b = blk + bh * len * d;
    for (int64_t j = 0; j < len * d; ++j) a[j] += b[j];
  }
}

}  // namespace

BlockPlan plan_block(const CpMask& mask, const CpSegment& qs, const CpSegment& ks) {
  // Query i (global qs.start + i) sees keys j (global ks.start + j) with
  // i + a <= j < i + b: a from the left window, b from the right one (causal: 0).
  const int64_t left = mask.window_left, right = mask.right();
  const int64_t delta = qs.start - ks.start;
  const bool has_lo = left >= 0, has_hi = right >= 0;
  const int64_t a = delta - left, b = delta + right + 1;
  BlockPlan plan;
  // Keys that some query sees, then the queries that see one of those keys.
  plan.j0 = has_lo ? std::max<int64_t>(0, a) : 0;
  plan.j1 = has_hi ? std::min<int64_t>(ks.length, qs.length - 1 + b) : ks.length;
  if (plan.j0 >= plan.j1) return plan;
  plan.i0 = has_hi ? std::max<int64_t>(0, plan.j0 - b + 1) : 0;
  plan.i1 = has_lo ? std::min<int64_t>(qs.length, plan.j1 - a) : qs.length;
  if (plan.i0 >= plan.i1) return plan;
  if (mask.doc_rows > 0 && !documents_meet(mask, qs.start + plan.i0, plan.i1 - plan.i0,
                                           ks.start + plan.j0, plan.j1 - plan.j0)) {
    return plan;
  }
  plan.skip = false;
  // In the sub-block's own indices query i' sees keys [i' - left', i' + right' + 1); both are
  // >= 0 by the choice of i0 and j0 above.
  const int64_t nq = plan.i1 - plan.i0, nk = plan.j1 - plan.j0;
  const int64_t left_k = plan.j0 - plan.i0 - a, right_k = plan.i0 + b - plan.j0 - 1;
  // The window is needed only where it hides something of the sub-block.
  plan.window_left = has_lo && nq - 1 - left_k > 0 ? left_k : -1;
  plan.window_right = has_hi && right_k + 1 < nk ? right_k : -1;
  plan.masked = plan.window_left >= 0 || plan.window_right >= 0 || mask.doc_rows > 0;
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t lo = plan.window_left >= 0 ? std::max<int64_t>(0, i - plan.window_left) : 0;
    const int64_t hi =
        plan.window_right >= 0 ? std::min<int64_t>(nk, i + plan.window_right + 1) : nk;
    plan.pairs += std::max<int64_t>(0, hi - lo);
  }
  return plan;
}

AttentionView rows_view(const Tensor& t, int64_t element_offset, int64_t B, int64_t H, int64_t S,
                        int64_t D, int64_t start, int64_t len) {
  AttentionView v;
  v.data = static_cast<char*>(t.data_ptr()) +
           (element_offset + start * D) * static_cast<int64_t>(t.element_size());
  v.dtype = t.dtype();
  v.device = t.device();
  const int64_t sizes[4] = {B, H, len, D};
  const int64_t strides[4] = {H * S * D, S * D, D, 1};
  for (int i = 0; i < 4; ++i) {
    v.sizes[i] = sizes[i];
    v.strides[i] = strides[i];
  }
  return v;
}

void block_forward(const BlockContext& c, const BlockPlan& plan, const CpSegment& qs,
                   const CpSegment& ks, const BlockViews& views, int64_t q_off, Tensor& out,
                   Tensor& lse) {
  const Dims& d = c.dims;
  const AttentionProblem p = block_problem(c, plan, qs, ks, views);
  const int64_t len = plan.i1 - plan.i0;
  Tensor blk_out = empty({d.B, d.Hq, len, d.D}, views.q.dtype);
  Tensor blk_lse = empty({d.B, d.Hq, len}, DType::kF32);
  kernel_for(c, p).forward(p, kernels::attention_view_of(blk_out, "block out"),
                           blk_lse.data<float>());
  const Tensor blk_out32 = as_f32(blk_out);
  const float* ob_all = blk_out32.data<float>();
  const float* lb_all = blk_lse.data<float>();
  float* acc_out = out.data<float>();
  float* acc_lse = lse.data<float>();
  const int64_t s_local = out.size(2), row0 = q_off + plan.i0;
  for (int64_t bh = 0; bh < d.B * d.Hq; ++bh) {
    for (int64_t i = 0; i < len; ++i) {
      const float lb = lb_all[bh * len + i];
      if (lb == kNegInf) continue;  // the block shows this row nothing
      float& la = acc_lse[bh * s_local + row0 + i];
      const float m = std::max(la, lb);
      const float wa = la == kNegInf ? 0.0f : std::exp(la - m);
      const float wb = std::exp(lb - m);
      const float sum = wa + wb;
      float* o = acc_out + (bh * s_local + row0 + i) * d.D;
      const float* ob = ob_all + (bh * len + i) * d.D;
      const float ca = wa / sum, cb = wb / sum;
      for (int64_t x = 0; x < d.D; ++x) o[x] = ca * o[x] + cb * ob[x];
      la = m + std::log(sum);
    }
  }
}

void block_backward(const BlockContext& c, const BlockPlan& plan, const CpSegment& qs,
                    const CpSegment& ks, const BlockViews& views, const Tensor& out,
                    const Tensor& dout, const Tensor& lse, int64_t q_off, Tensor& dq, float* dk,
                    float* dv, int64_t s_kv, int64_t k_off) {
  const Dims& d = c.dims;
  const AttentionProblem p = block_problem(c, plan, qs, ks, views);
  const int64_t nq = plan.i1 - plan.i0, nk = plan.j1 - plan.j0;
  const int64_t s_local = out.size(2), row0 = q_off + plan.i0;
  const Tensor blk_lse = contiguous(narrow(lse, 2, row0, nq));
  const DType dt = views.q.dtype;
  Tensor dq_blk = empty({d.B, d.Hq, nq, d.D}, dt);
  Tensor dk_blk = empty({d.B, d.Hkv, nk, d.D}, dt);
  Tensor dv_blk = empty({d.B, d.Hkv, nk, d.D}, dt);
  kernel_for(c, p).backward(p, rows_view(out, 0, d.B, d.Hq, s_local, d.D, row0, nq),
                            rows_view(dout, 0, d.B, d.Hq, s_local, d.D, row0, nq),
                            blk_lse.data<float>(), kernels::attention_view_of(dq_blk, "dq"),
                            kernels::attention_view_of(dk_blk, "dk"),
                            kernels::attention_view_of(dv_blk, "dv"));
  add_rows(dq.data<float>(), s_local, row0, as_f32(dq_blk).data<float>(), d.B * d.Hq, nq, d.D);
  const int64_t key0 = k_off + plan.j0;
  add_rows(dk, s_kv, key0, as_f32(dk_blk).data<float>(), d.B * d.Hkv, nk, d.D);
  add_rows(dv, s_kv, key0, as_f32(dv_blk).data<float>(), d.B * d.Hkv, nk, d.D);
}

}  // namespace tessel::parallel::internal
