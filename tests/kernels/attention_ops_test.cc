// The plain attention of tensor ops (kernels/attention/attention_ops.h) that the math backend
// runs on devices without a fused kernel, checked here on the CPU against the math reference:
// outputs, logsumexp and gradients, dense and causal (both alignments), grouped heads,
// strided views, f32 and bf16. On a GPU the same code runs on CUDA tensors (tests/gpu).
#include "tessel/kernels/attention/attention_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessel/kernels/attention/attention_math.h"
#include "tessel/tensor/ops.h"

namespace tessel::kernels::attention {
namespace {

AttentionView view_of(const Tensor& t) {
  AttentionView v;
  v.data = t.data_ptr();
  v.dtype = t.dtype();
  v.device = t.device();
  for (int d = 0; d < 4; ++d) {
    v.sizes[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return item(max(abs(sub(to(a, DType::kF32), to(b, DType::kF32)))));
}

struct Case {
  int64_t B, Hq, Hkv, Sq, Sk, D;
  bool causal;
  MaskAlignment alignment;
  DType dtype;
};

void check(const Case& c) {
  SCOPED_TRACE(testing::Message() << "B " << c.B << " Hq " << c.Hq << " Hkv " << c.Hkv << " Sq "
                                  << c.Sq << " Sk " << c.Sk << " causal " << c.causal << " "
                                  << dtype_name(c.dtype));
  Generator gen(11);
  // q as a transposed (B, S, H, D) view, like the heads of a projection.
  const Tensor q = permute(to(randn({c.B, c.Sq, c.Hq, c.D}, gen), c.dtype), {0, 2, 1, 3});
  const Tensor k = to(randn({c.B, c.Hkv, c.Sk, c.D}, gen), c.dtype);
  const Tensor v = to(randn({c.B, c.Hkv, c.Sk, c.D}, gen), c.dtype);
  const Tensor dout = to(randn({c.B, c.Hq, c.Sq, c.D}, gen), c.dtype);
  AttentionProblem p;
  p.q = view_of(q);
  p.k = view_of(k);
  p.v = view_of(v);
  p.mask.causal = c.causal;
  p.mask.alignment = c.alignment;
  validate_attention_problem(p);
  ASSERT_EQ(ops_attention_unsupported(p), "");

  const Tensor out = empty({c.B, c.Hq, c.Sq, c.D}, c.dtype), ref = empty_like(out);
  const Tensor lse = empty({c.B, c.Hq, c.Sq}), ref_lse = empty_like(lse);
  ops_attention_forward(p, view_of(out), lse.data<float>());
  math_attention_forward(p, view_of(ref), ref_lse.data<float>(), {.f64_accumulate = true});
  // bf16: the ops path rounds the probabilities to bf16 before the second product.
  const double tol = c.dtype == DType::kF32 ? 2e-5 : 3e-2;
  EXPECT_LT(max_abs_diff(out, ref), tol);
  EXPECT_LT(max_abs_diff(lse, ref_lse), c.dtype == DType::kF32 ? 2e-5 : 2e-2);

  const Tensor dq = empty_like(out), dk = empty_like(k), dv = empty_like(v);
  const Tensor rq = empty_like(out), rk = empty_like(k), rv = empty_like(v);
  ops_attention_backward(p, view_of(out), view_of(dout), view_of(dq), view_of(dk), view_of(dv));
  math_attention_backward(p, view_of(dout), view_of(rq), view_of(rk), view_of(rv),
                          {.f64_accumulate = true});
  const double gtol = c.dtype == DType::kF32 ? 1e-4 : 1.5e-1;
  EXPECT_LT(max_abs_diff(dq, rq), gtol);
  EXPECT_LT(max_abs_diff(dk, rk), gtol);
  EXPECT_LT(max_abs_diff(dv, rv), gtol);
}

TEST(AttentionOpsTest, MatchesTheMathReference) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    check({2, 4, 4, 17, 17, 16, false, MaskAlignment::kTopLeft, dtype});
    check({2, 4, 4, 17, 17, 16, true, MaskAlignment::kTopLeft, dtype});
    check({1, 6, 2, 9, 23, 8, true, MaskAlignment::kBottomRight, dtype});  // grouped heads
    check({1, 2, 1, 23, 9, 8, true, MaskAlignment::kTopLeft, dtype});
  }
}

TEST(AttentionOpsTest, RefusesMasksItCannotExpress) {
  const Tensor q = randn({1, 1, 4, 8});
  AttentionProblem p;
  p.q = p.k = p.v = view_of(q);
  p.mask.window_left = 2;
  EXPECT_NE(ops_attention_unsupported(p).find("window"), std::string::npos);
  p.mask.window_left = -1;
  p.dropout.p = 0.1;
  EXPECT_NE(ops_attention_unsupported(p).find("dropout"), std::string::npos);
  p.dropout.p = 0;
  p.mask.causal = true;
  p.mask.alignment = MaskAlignment::kBottomRight;
  const Tensor k = randn({1, 1, 2, 8});
  p.k = p.v = view_of(k);
  EXPECT_NE(ops_attention_unsupported(p).find("more queries than keys"), std::string::npos);
}

}  // namespace
}  // namespace tessel::kernels::attention
