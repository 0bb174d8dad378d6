#include "tessel/kernels/attention/attention_problem.h"

#include <cmath>

#include "tessel/base/error.h"

namespace tessel::kernels::attention {
namespace {

std::string sizes_str(const AttentionView& v) {
  return fmt::format("({}, {}, {}, {})", v.sizes[0], v.sizes[1], v.sizes[2], v.sizes[3]);
}

void check_view(const AttentionView& v, const char* name) {
  for (int d = 0; d < 4; ++d) {
    TESSEL_CHECK(v.sizes[d] >= 0, InvalidArgument, "attention: {} has negative size {} in {}", name,
                 v.sizes[d], sizes_str(v));
  }
  TESSEL_CHECK(v.dtype == DType::kF32 || v.dtype == DType::kBF16 || v.dtype == DType::kF16,
               InvalidArgument, "attention: {} has dtype {}; expected f32, bf16 or f16", name,
               dtype_name(v.dtype));
  const int64_t numel = v.sizes[0] * v.sizes[1] * v.sizes[2] * v.sizes[3];
  TESSEL_CHECK(numel == 0 || v.data != nullptr, InvalidArgument, "attention: {} {} has no data",
               name, sizes_str(v));
}

}  // namespace

AttentionView attention_view(void* data, DType dtype, const int64_t (&sizes)[4]) {
  AttentionView v;
  v.data = data;
  v.dtype = dtype;
  int64_t stride = 1;
  for (int d = 3; d >= 0; --d) {
    v.sizes[d] = sizes[d];
    v.strides[d] = stride;
    stride *= sizes[d];
  }
  return v;
}

AttentionView attention_view(const void* data, DType dtype, const int64_t (&sizes)[4]) {
  return attention_view(const_cast<void*>(data), dtype, sizes);
}

double AttentionProblem::softmax_scale() const {
  if (scale) return *scale;
  return head_dim() > 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim())) : 1.0;
}

void validate_attention_problem(const AttentionProblem& p) {
  check_view(p.q, "q");
  check_view(p.k, "k");
  check_view(p.v, "v");
  TESSEL_CHECK(p.k.dtype == p.q.dtype && p.v.dtype == p.q.dtype, InvalidArgument,
               "attention: dtypes differ: q {}, k {}, v {}; expected one dtype",
               dtype_name(p.q.dtype), dtype_name(p.k.dtype), dtype_name(p.v.dtype));
  TESSEL_CHECK(p.k.device == p.q.device && p.v.device == p.q.device, InvalidArgument,
               "attention: devices differ: q {}, k {}, v {}; expected one device", p.q.device.str(),
               p.k.device.str(), p.v.device.str());
  TESSEL_CHECK(p.k.batch() == p.q.batch() && p.v.batch() == p.q.batch(), InvalidArgument,
               "attention: batch sizes differ: q {}, k {}, v {}", sizes_str(p.q), sizes_str(p.k),
               sizes_str(p.v));
  TESSEL_CHECK(p.k.heads() == p.v.heads(), InvalidArgument,
               "attention: k has {} heads but v has {}; expected equal", p.k.heads(), p.v.heads());
  TESSEL_CHECK(p.k.seq() == p.v.seq(), InvalidArgument,
               "attention: k has {} keys but v has {}; expected equal", p.k.seq(), p.v.seq());
  TESSEL_CHECK(p.k.heads() > 0 || p.q.heads() == 0, InvalidArgument,
               "attention: q has {} heads but k and v have 0", p.q.heads());
  TESSEL_CHECK(p.k.heads() == 0 || p.q.heads() % p.k.heads() == 0, InvalidArgument,
               "attention: q has {} heads, not a multiple of the {} key/value heads "
               "(grouped-query attention needs H_q % H_kv == 0)",
               p.q.heads(), p.k.heads());
  TESSEL_CHECK(p.k.head_dim() == p.q.head_dim(), InvalidArgument,
               "attention: q head dim {} differs from k head dim {}", p.q.head_dim(),
               p.k.head_dim());
  TESSEL_CHECK(p.v.head_dim() == p.q.head_dim(), InvalidArgument,
               "attention: v head dim {} differs from q head dim {} (this kernel needs equal "
               "head dims)",
               p.v.head_dim(), p.q.head_dim());
  const AttentionMask& m = p.mask;
  TESSEL_CHECK(m.window_left >= -1, InvalidArgument,
               "attention: window_left {} is negative; expected -1 (unbounded) or >= 0",
               m.window_left);
  TESSEL_CHECK(m.window_right >= -1, InvalidArgument,
               "attention: window_right {} is negative; expected -1 (unbounded) or >= 0",
               m.window_right);
  const auto n_prefix = static_cast<int64_t>(m.prefix_lengths.size());
  TESSEL_CHECK(n_prefix <= 1 || n_prefix == p.batch(), InvalidArgument,
               "attention: {} prefix lengths for batch size {}; expected 0, 1 or {}", n_prefix,
               p.batch(), p.batch());
  for (int64_t len : m.prefix_lengths) {
    TESSEL_CHECK(len >= 0, InvalidArgument, "attention: prefix length {} is negative", len);
  }
  const auto n_qdoc = static_cast<int64_t>(m.q_document_ids.size());
  const auto n_kvdoc = static_cast<int64_t>(m.kv_document_ids.size());
  if (n_qdoc > 0 || n_kvdoc > 0) {
    TESSEL_CHECK(n_qdoc == p.q_len() || n_qdoc == p.batch() * p.q_len(), InvalidArgument,
                 "attention: {} query document ids; expected S_q = {} or B * S_q = {}", n_qdoc,
                 p.q_len(), p.batch() * p.q_len());
    if (n_kvdoc == 0) {
      TESSEL_CHECK(p.q_len() == p.kv_len(), InvalidArgument,
                   "attention: no key document ids and S_q {} != S_k {}; pass "
                   "kv_document_ids of length S_k",
                   p.q_len(), p.kv_len());
    } else {
      TESSEL_CHECK(n_kvdoc == p.kv_len() || n_kvdoc == p.batch() * p.kv_len(), InvalidArgument,
                   "attention: {} key document ids; expected S_k = {} or B * S_k = {}", n_kvdoc,
                   p.kv_len(), p.batch() * p.kv_len());
    }
  }
  TESSEL_CHECK(p.dropout.p >= 0.0 && p.dropout.p < 1.0, InvalidArgument,
               "attention: dropout p {} outside [0, 1)", p.dropout.p);
  TESSEL_CHECK(!p.scale || std::isfinite(*p.scale), InvalidArgument,
               "attention: scale {} is not finite", p.scale.value_or(0.0));
}

void validate_attention_output(const AttentionView& view, const AttentionView& like,
                               const char* what) {
  for (int d = 0; d < 4; ++d) {
    TESSEL_CHECK(view.sizes[d] == like.sizes[d], InvalidArgument,
                 "attention: {} has sizes {}; expected {}", what, sizes_str(view), sizes_str(like));
  }
  TESSEL_CHECK(view.dtype == DType::kF32 || view.dtype == DType::kBF16 || view.dtype == DType::kF16,
               InvalidArgument, "attention: {} has dtype {}; expected f32, bf16 or f16", what,
               dtype_name(view.dtype));
  TESSEL_CHECK(view.device == like.device, InvalidArgument, "attention: {} is on {}; expected {}",
               what, view.device.str(), like.device.str());
}

}  // namespace tessel::kernels::attention
