#include "tessel/kernels/attention/sdpa.h"

#include <cmath>
#include <limits>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/ops.h"

namespace tessel::kernels {
namespace {

// True above the diagonal: the keys query i must not see. Bool (Sq, Sk).
Tensor causal_mask(int64_t sq, int64_t sk) {
  std::vector<uint8_t> mask(static_cast<size_t>(sq * sk));
  for (int64_t i = 0; i < sq; ++i) {
    for (int64_t j = 0; j < sk; ++j) mask[i * sk + j] = j > i;
  }
  return from_data(mask.data(), sq * sk, {sq, sk}, DType::kBool);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& options) {
  TESSEL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, InvalidArgument,
               "scaled_dot_product_attention needs (B, H, S, D) tensors, got q {} k {} v {}",
               shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  TESSEL_CHECK(q.size(0) == k.size(0) && q.size(0) == v.size(0) && q.size(1) == k.size(1) &&
                   q.size(1) == v.size(1) && q.size(3) == k.size(3) && k.size(2) == v.size(2),
               InvalidArgument,
               "scaled_dot_product_attention: q {} k {} v {} do not fit together (need equal "
               "B and H, q and k sharing D, k and v sharing S)",
               shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  const int64_t sq = q.size(2), sk = k.size(2);
  TESSEL_CHECK(!options.causal || sq <= sk, InvalidArgument,
               "causal attention with {} queries but only {} keys", sq, sk);
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));

  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), scale);  // (B, H, Sq, Sk)
  if (options.causal) {
    scores = masked_fill(scores, to(causal_mask(sq, sk), q.device()),
                         -std::numeric_limits<double>::infinity());
  }
  return matmul(softmax(scores, -1), v);
}

}  // namespace tessel::kernels
