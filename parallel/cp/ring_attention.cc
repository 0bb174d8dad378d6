#include "tessel/parallel/cp/ring_attention.h"

#include <algorithm>
#include <any>
#include <limits>
#include <memory>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/parallel/cp/internal/cp_blocks.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::parallel {
namespace {

using internal::BlockContext;
using internal::BlockPlan;
using internal::BlockViews;
using internal::CpMask;
using internal::Dims;
using internal::rows_view;

constexpr int kKvTag = 7301;   // p2p tag of the ring's K/V messages
constexpr int kDkvTag = 7302;  // p2p tag of the dK/dV accumulators in backward

// Per-rank state shared by forward and backward.
struct CpState {
  ProcessGroup* group = nullptr;
  CpLayout layout;
  RingAttentionOptions options;
  CpAttentionAlgorithm algorithm = CpAttentionAlgorithm::kRing;
  Dims dims;
  DType dtype = DType::kF32;
  CpMask mask;
  RingAttentionStats stats;
  std::shared_ptr<RingAttentionStats> backward_stats = std::make_shared<RingAttentionStats>();

  BlockContext context() const { return {&mask, dims, &options}; }
  const std::vector<CpSegment>& segments(int rank) const {
    return layout.ranks[static_cast<size_t>(rank)];
  }
};

// Sends `out` to the next rank and receives `in` from the previous one, asynchronously. Even
// ranks issue the send first and odd ranks the receive, so backends whose sends wait for the
// receiver do not deadlock; every rank issues its shifts in the same order.
void ring_shift(ProcessGroup& group, const Tensor& out, Tensor& in, int tag,
                std::vector<Work>& works) {
  const int n = group.size(), r = group.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    works.push_back(group.send(out, next, {.tag = tag, .async = true}));
    works.push_back(group.recv(in, prev, {.tag = tag, .async = true}));
  } else {
    works.push_back(group.recv(in, prev, {.tag = tag, .async = true}));
    works.push_back(group.send(out, next, {.tag = tag, .async = true}));
  }
}

// Waits for `works`, adding the time blocked to `exposed`.
void wait_all(std::vector<Work>& works, Nanoseconds& exposed) {
  const Stopwatch watch;
  for (Work& w : works) w.wait();
  works.clear();
  exposed += watch.elapsed();
}

// K and V of one rank packed as (2, B, H_kv, S, D), the unit that travels.
Tensor pack_kv(const Tensor& k, const Tensor& v) { return contiguous(stack({k, v}, 0)); }

// Plans every (query segment of `rank`, key segment of `owner`) block and calls
// fn(plan, qs, ks, q_off, k_off) for those the masks leave, counting into `stats`.
template <typename Fn>
void for_each_block(const CpState& st, int rank, int owner, RingAttentionStats* stats, Fn fn) {
  int64_t q_off = 0;
  for (const CpSegment& qs : st.segments(rank)) {
    int64_t k_off = 0;
    for (const CpSegment& ks : st.segments(owner)) {
      const BlockPlan plan = internal::plan_block(st.mask, qs, ks);
      if (plan.skip) {
        if (stats) ++stats->blocks_skipped;
      } else {
        if (stats) {
          ++stats->blocks_computed;
          if (plan.masked) ++stats->blocks_masked;
          stats->scores += plan.pairs * st.dims.B * st.dims.Hq;
        }
        fn(plan, qs, ks, q_off, k_off);
      }
      k_off += ks.length;
    }
    q_off += qs.length;
  }
}

// Views of rank `rank`'s queries and of the K/V block `kv` ((2, B, H_kv, s_stride, D), the
// owner's s_kv tokens first) for one (qs, ks) block.
BlockViews views_of(const CpState& st, const Tensor& q, const Tensor& kv, int64_t s_stride,
                    const CpSegment& qs, int64_t q_off, const CpSegment& ks, int64_t k_off,
                    int64_t kv_offset = 0) {
  const Dims& d = st.dims;
  const int64_t s_local = q.size(2);
  const int64_t v_off = kv_offset + d.B * d.Hkv * s_stride * d.D;
  return {rows_view(q, 0, d.B, d.Hq, s_local, d.D, q_off, qs.length),
          rows_view(kv, kv_offset, d.B, d.Hkv, s_stride, d.D, k_off, ks.length),
          rows_view(kv, v_off, d.B, d.Hkv, s_stride, d.D, k_off, ks.length)};
}

struct ForwardResult {
  Tensor out;  // f32 accumulator
  Tensor lse;
  Tensor gathered_kv;  // all-gather schedule: (n, 2, B, H_kv, S_max, D), kept for backward
};

ForwardResult new_accumulators(const CpState& st) {
  const Dims& d = st.dims;
  const int64_t s_local = st.layout.local_len(st.group->rank());
  return {zeros({d.B, d.Hq, s_local, d.D}, DType::kF32),
          full({d.B, d.Hq, s_local}, -std::numeric_limits<double>::infinity(), DType::kF32),
          Tensor()};
}

ForwardResult ring_forward(CpState& st, const Tensor& q, const Tensor& k, const Tensor& v) {
  ProcessGroup& group = *st.group;
  const Dims& d = st.dims;
  const int n = group.size(), r = group.rank();
  ForwardResult res = new_accumulators(st);
  const BlockContext c = st.context();
  Tensor kv = pack_kv(k, v);
  for (int step = 0; step < n; ++step) {
    const int owner = (r - step + n) % n;
    const int64_t s_kv = st.layout.local_len(owner);
    std::vector<Work> pending;
    Tensor next_kv;
    if (step + 1 < n) {  // start the next block's transfer before computing on this one
      next_kv = empty({2, d.B, d.Hkv, st.layout.local_len((owner + n - 1) % n), d.D}, st.dtype);
      ring_shift(group, kv, next_kv, kKvTag, pending);
    }
    for_each_block(st, r, owner, &st.stats,
                   [&](const BlockPlan& plan, const CpSegment& qs, const CpSegment& ks,
                       int64_t q_off, int64_t k_off) {
                     internal::block_forward(c, plan, qs, ks,
                                             views_of(st, q, kv, s_kv, qs, q_off, ks, k_off), q_off,
                                             res.out, res.lse);
                   });
    wait_all(pending, st.stats.exposed_wait);
    if (step + 1 < n) kv = next_kv;
  }
  return res;
}

std::vector<Tensor> ring_backward(CpState& st, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout) {
  ProcessGroup& group = *st.group;
  const Dims& d = st.dims;
  const int n = group.size(), r = group.rank();
  const int64_t s_local = st.layout.local_len(r);
  const BlockContext c = st.context();
  RingAttentionStats& stats = *st.backward_stats;
  Tensor dq = zeros({d.B, d.Hq, s_local, d.D}, DType::kF32);
  Tensor kv = pack_kv(k, v);
  Tensor dkv_done;  // the f32 (2, B, H_kv, S, D) dK/dV of the previous step's block
  for (int step = 0; step < n; ++step) {
    const int owner = (r - step + n) % n;
    const int64_t s_kv = st.layout.local_len(owner);
    std::vector<Work> pending;
    Tensor next_kv, dkv_in;
    if (step + 1 < n) {
      next_kv = empty({2, d.B, d.Hkv, st.layout.local_len((owner + n - 1) % n), d.D}, st.dtype);
      ring_shift(group, kv, next_kv, kKvTag, pending);
    }
    if (step > 0) {  // the previous block's dK/dV goes on; this block's comes from r - 1
      dkv_in = empty({2, d.B, d.Hkv, s_kv, d.D}, DType::kF32);
      ring_shift(group, dkv_done, dkv_in, kDkvTag, pending);
    }
    Tensor dkv = zeros({2, d.B, d.Hkv, s_kv, d.D}, DType::kF32);
    float* dk = dkv.data<float>();
    float* dv = dk + d.B * d.Hkv * s_kv * d.D;
    for_each_block(st, r, owner, &stats,
                   [&](const BlockPlan& plan, const CpSegment& qs, const CpSegment& ks,
                       int64_t q_off, int64_t k_off) {
                     internal::block_backward(c, plan, qs, ks,
                                              views_of(st, q, kv, s_kv, qs, q_off, ks, k_off), out,
                                              dout, lse, q_off, dq, dk, dv, s_kv, k_off);
                   });
    wait_all(pending, stats.exposed_wait);
    if (step > 0) add_(dkv, dkv_in);
    dkv_done = dkv;
    if (step + 1 < n) kv = next_kv;
  }
  if (n > 1) {  // the last block's dK/dV goes home to its owner, r + 1; ours comes from r - 1
    Tensor own = empty({2, d.B, d.Hkv, s_local, d.D}, DType::kF32);
    std::vector<Work> pending;
    ring_shift(group, dkv_done, own, kDkvTag, pending);
    wait_all(pending, stats.exposed_wait);
    dkv_done = own;
  }
  return {dq, select(dkv_done, 0, 0), select(dkv_done, 0, 1)};
}

// The longest local length: every rank's K/V padded to it for the all-gather.
int64_t max_local_len(const CpLayout& layout) {
  int64_t m = 0;
  for (int r = 0; r < layout.cp(); ++r) m = std::max(m, layout.local_len(r));
  return m;
}

// This rank's (2, B, H_kv, S_local, D) K/V gathered from every rank: (n, 2, B, H_kv, S_max, D).
Tensor gather_kv(CpState& st, const Tensor& k, const Tensor& v, Nanoseconds& exposed) {
  const Dims& d = st.dims;
  const int n = st.group->size();
  const int64_t s_max = max_local_len(st.layout);
  Tensor local = zeros({2, d.B, d.Hkv, s_max, d.D}, st.dtype);
  copy_(narrow(local, 3, 0, k.size(2)), stack({k, v}, 0));
  Tensor all = empty({n, 2, d.B, d.Hkv, s_max, d.D}, st.dtype);
  std::vector<Work> pending{st.group->all_gather(local, all, {.async = true})};
  wait_all(pending, exposed);
  return all;
}

ForwardResult all_gather_forward(CpState& st, const Tensor& q, const Tensor& k, const Tensor& v) {
  const Dims& d = st.dims;
  const int n = st.group->size(), r = st.group->rank();
  ForwardResult res = new_accumulators(st);
  res.gathered_kv = gather_kv(st, k, v, st.stats.exposed_wait);
  const int64_t s_max = max_local_len(st.layout);
  const int64_t per_rank = 2 * d.B * d.Hkv * s_max * d.D;
  const BlockContext c = st.context();
  for (int owner = 0; owner < n; ++owner) {
    for_each_block(st, r, owner, &st.stats,
                   [&](const BlockPlan& plan, const CpSegment& qs, const CpSegment& ks,
                       int64_t q_off, int64_t k_off) {
                     internal::block_forward(c, plan, qs, ks,
                                             views_of(st, q, res.gathered_kv, s_max, qs, q_off, ks,
                                                      k_off, owner * per_rank),
                                             q_off, res.out, res.lse);
                   });
  }
  return res;
}

std::vector<Tensor> all_gather_backward(CpState& st, const Tensor& q, const Tensor& gathered_kv,
                                        const Tensor& out, const Tensor& lse, const Tensor& dout) {
  const Dims& d = st.dims;
  const int n = st.group->size(), r = st.group->rank();
  const int64_t s_local = st.layout.local_len(r), s_max = max_local_len(st.layout);
  const int64_t per_rank = 2 * d.B * d.Hkv * s_max * d.D, plane = per_rank / 2;
  const BlockContext c = st.context();
  RingAttentionStats& stats = *st.backward_stats;
  Tensor dq = zeros({d.B, d.Hq, s_local, d.D}, DType::kF32);
  Tensor dkv_all = zeros({n, 2, d.B, d.Hkv, s_max, d.D}, DType::kF32);
  for (int owner = 0; owner < n; ++owner) {
    float* dk = dkv_all.data<float>() + owner * per_rank;
    for_each_block(
        st, r, owner, &stats,
        [&](const BlockPlan& plan, const CpSegment& qs, const CpSegment& ks, int64_t q_off,
            int64_t k_off) {
          internal::block_backward(
              c, plan, qs, ks,
              views_of(st, q, gathered_kv, s_max, qs, q_off, ks, k_off, owner * per_rank), out,
              dout, lse, q_off, dq, dk, dk + plane, s_max, k_off);
        });
  }
  Tensor own = empty({2, d.B, d.Hkv, s_max, d.D}, DType::kF32);
  std::vector<Work> pending{st.group->reduce_scatter(dkv_all, own, {.async = true})};
  wait_all(pending, stats.exposed_wait);
  return {dq, narrow(select(own, 0, 0), 2, 0, s_local), narrow(select(own, 0, 1), 2, 0, s_local)};
}

// The mask of the call: causal and window as given, document ids gathered from every rank and
// laid out in global order (one small all_gather).
CpMask gather_mask(ProcessGroup& group, const CpLayout& layout, const RingAttentionOptions& o) {
  CpMask m;
  m.causal = o.causal;
  m.window_left = o.window_left;
  m.window_right = o.window_right;
  m.seq_len = layout.seq_len;
  if (!o.document_ids.defined()) return m;
  const Tensor ids =
      to(o.document_ids.dim() == 1 ? unsqueeze(o.document_ids, 0) : o.document_ids, DType::kI64);
  m.doc_rows = ids.size(0);
  const int n = group.size();
  const int64_t s_max = max_local_len(layout);
  Tensor local = zeros({m.doc_rows, s_max}, DType::kI64);
  copy_(narrow(local, 1, 0, ids.size(1)), ids);
  Tensor all = empty({n, m.doc_rows, s_max}, DType::kI64);
  group.all_gather(local, all);
  const std::vector<int64_t> gathered = to_vector<int64_t>(all);
  m.docs.assign(static_cast<size_t>(m.doc_rows * m.seq_len), 0);
  for (int r = 0; r < n; ++r) {
    for (int64_t b = 0; b < m.doc_rows; ++b) {
      const int64_t* src = gathered.data() + (r * m.doc_rows + b) * s_max;
      for (const CpSegment& s : layout.ranks[static_cast<size_t>(r)]) {
        std::copy(src, src + s.length, m.docs.data() + b * m.seq_len + s.start);
        src += s.length;
      }
    }
  }
  return m;
}

void check_inputs(const ProcessGroup& group, const Tensor& q, const Tensor& k, const Tensor& v,
                  const CpLayout& layout, const RingAttentionOptions& options) {
  TESSEL_CHECK(layout.cp() == group.size(), InvalidArgument,
               "ring_attention: the layout has {} ranks but the cp group has {}", layout.cp(),
               group.size());
  for (const Tensor* t : {&q, &k, &v}) {
    TESSEL_CHECK(t->dim() == 4 && (t->dtype() == DType::kF32 || t->dtype() == DType::kBF16) &&
                     t->dtype() == q.dtype() && t->device().is_cpu(),
                 InvalidArgument,
                 "ring_attention: q, k, v must be 4-D (B, H, S, D) CPU tensors of one dtype, "
                 "f32 or bf16; got {} {} (q is {})",
                 shape_str(t->shape()), dtype_name(t->dtype()), dtype_name(q.dtype()));
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
  TESSEL_CHECK(options.window_left >= -1 && options.window_right >= -1, InvalidArgument,
               "ring_attention: window ({}, {}); expected -1 (unbounded) or >= 0 each",
               options.window_left, options.window_right);
  const Tensor& ids = options.document_ids;
  if (ids.defined()) {
    const bool shape_ok = (ids.dim() == 1 && ids.size(0) == s_local) ||
                          (ids.dim() == 2 && ids.size(0) == q.size(0) && ids.size(1) == s_local);
    TESSEL_CHECK(shape_ok && !is_floating(ids.dtype()), InvalidArgument,
                 "ring_attention: document ids {} {} on rank {}; expected integer ids of shape "
                 "({}) or ({}, {}), this rank's tokens",
                 shape_str(ids.shape()), dtype_name(ids.dtype()), group.rank(), s_local, q.size(0),
                 s_local);
  }
}

}  // namespace

RingAttentionOutput ring_attention(ProcessGroup& group, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const CpLayout& layout,
                                   const RingAttentionOptions& options) {
  check_inputs(group, q, k, v, layout, options);
  auto state = std::make_shared<CpState>();
  state->group = &group;
  state->layout = layout;
  state->options = options;
  state->options.document_ids = Tensor();  // kept gathered in `mask`
  state->dims = {q.size(0), q.size(1), k.size(1), q.size(3)};
  state->dtype = q.dtype();
  state->algorithm = options.algorithm;
  if (state->algorithm == CpAttentionAlgorithm::kAuto) {
    state->algorithm = group.size() * k.size(1) <= q.size(1) ? CpAttentionAlgorithm::kAllGather
                                                             : CpAttentionAlgorithm::kRing;
  }
  state->stats.algorithm = state->backward_stats->algorithm = state->algorithm;
  state->mask = gather_mask(group, layout, options);

  auto forward = [state](FunctionContext& ctx, const std::vector<Tensor>& in) {
    const Tensor q_c = contiguous(in[0]), k_c = contiguous(in[1]), v_c = contiguous(in[2]);
    const bool ring = state->algorithm == CpAttentionAlgorithm::kRing;
    ForwardResult res =
        ring ? ring_forward(*state, q_c, k_c, v_c) : all_gather_forward(*state, q_c, k_c, v_c);
    // The kernel's backward takes the output in q's dtype, as one process's attention keeps it.
    Tensor out = state->dtype == DType::kF32 ? res.out : to(res.out, state->dtype);
    ctx.save_for_backward({q_c, k_c, v_c, out, res.lse});
    ctx.data = res.gathered_kv;  // all-gather schedule: every rank's K/V
    return std::vector<Tensor>{out, res.lse};
  };
  auto backward = [state](FunctionContext& ctx, const std::vector<Tensor>& grads) {
    const std::vector<Tensor>& s = ctx.saved_tensors();
    Tensor dout = grads[0].defined() ? contiguous(to(grads[0], state->dtype)) : zeros_like(s[3]);
    std::vector<Tensor> g =
        state->algorithm == CpAttentionAlgorithm::kRing
            ? ring_backward(*state, s[0], s[1], s[2], s[3], s[4], dout)
            : all_gather_backward(*state, s[0], std::any_cast<Tensor>(ctx.data), s[3], s[4], dout);
    for (Tensor& t : g) t = contiguous(to(t, state->dtype));
    return g;
  };
  std::vector<Tensor> outs = apply_function("ring_attention", {q, k, v}, forward, backward);
  return {outs[0], outs[1], state->stats, state->backward_stats};
}

}  // namespace tessel::parallel
