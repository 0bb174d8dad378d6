// Finite-difference gradient checks for every differentiable op, with broadcasting and
// non-contiguous (transposed, sliced, expanded) inputs.
#include "gradcheck.h"

namespace tessel {
namespace {

using testing::expect_gradients_match;

Tensor rnd(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, gen);
}
// Values in [lo, hi) for ops with restricted domains.
Tensor uniform(const Shape& shape, double lo, double hi, uint64_t seed) {
  Generator gen(seed);
  return add(mul(rand(shape, gen), hi - lo), lo);
}

TEST(GradCheckTest, AddSubMulDiv_Broadcasting) {
  expect_gradients_match([](const auto& in) { return add(in[0], in[1]); },
                         {rnd({3, 4}, 1), rnd({4}, 2)});
  expect_gradients_match([](const auto& in) { return sub(in[0], in[1]); },
                         {rnd({3, 1}, 3), rnd({1, 5}, 4)});
  expect_gradients_match([](const auto& in) { return mul(in[0], in[1]); },
                         {rnd({2, 3, 4}, 5), rnd({3, 1}, 6)});
  expect_gradients_match([](const auto& in) { return div(in[0], in[1]); },
                         {rnd({3, 4}, 7), uniform({4}, 1.0, 2.0, 8)});
  expect_gradients_match([](const auto& in) { return sub(2.0, div(3.0, in[0])); },
                         {uniform({5}, 1.0, 2.0, 9)});
}

TEST(GradCheckTest, Elementwise_NonContiguousInputs) {
  expect_gradients_match([](const auto& in) { return mul(transpose(in[0], 0, 1), in[1]); },
                         {rnd({4, 3}, 10), rnd({3, 4}, 11)});
  expect_gradients_match([](const auto& in) { return add(slice(in[0], 1, 1, 6, 2), in[1]); },
                         {rnd({3, 6}, 12), rnd({3, 3}, 13)});
  expect_gradients_match(
      [](const auto& in) {
        return mul(expand(in[0], {3, 4}), in[1]);
      },
      {rnd({1, 4}, 14), rnd({3, 4}, 15)});
}

TEST(GradCheckTest, UnaryOps) {
  const std::vector<Tensor> x = {rnd({3, 5}, 20)};
  expect_gradients_match([](const auto& in) { return neg(in[0]); }, x);
  expect_gradients_match([](const auto& in) { return exp(in[0]); }, x);
  expect_gradients_match([](const auto& in) { return tanh(in[0]); }, x);
  expect_gradients_match([](const auto& in) { return sigmoid(in[0]); }, x);
  expect_gradients_match([](const auto& in) { return silu(in[0]); }, x);
  expect_gradients_match([](const auto& in) { return gelu(in[0]); }, x);
  expect_gradients_match([](const auto& in) { return gelu(in[0], GeluApproximation::kTanh); }, x);
  const std::vector<Tensor> pos = {uniform({3, 5}, 0.5, 2.0, 21)};
  expect_gradients_match([](const auto& in) { return log(in[0]); }, pos);
  expect_gradients_match([](const auto& in) { return sqrt(in[0]); }, pos);
  expect_gradients_match([](const auto& in) { return rsqrt(in[0]); }, pos);
  expect_gradients_match([](const auto& in) { return pow(in[0], 3.0); }, pos);
  expect_gradients_match([](const auto& in) { return pow(in[0], in[1]); },
                         {uniform({3, 5}, 0.5, 2.0, 22), rnd({5}, 23)});
  // Away from the kinks at 0.
  const std::vector<Tensor> away = {add(mul(to(gt(rnd({4, 4}, 24), 0.0), DType::kF32), 2.0), -1.0)};
  expect_gradients_match([](const auto& in) { return relu(add(in[0], 0.5)); }, away);
  expect_gradients_match([](const auto& in) { return abs(add(in[0], 0.5)); }, away);
}

TEST(GradCheckTest, MaximumMinimumWhereMaskedFill) {
  // a = +-1 + small noise and b = small noise never come within a finite-difference step.
  const Tensor signs = add(mul(to(gt(rnd({3, 4}, 30), 0.0), DType::kF32), 2.0), -1.0);
  const Tensor a = add(signs, mul(rnd({3, 4}, 31), 0.1));
  expect_gradients_match([](const auto& in) { return maximum(in[0], in[1]); },
                         {a, mul(rnd({4}, 32), 0.1)});
  expect_gradients_match([](const auto& in) { return minimum(in[0], in[1]); },
                         {a, mul(rnd({3, 4}, 33), 0.1)});
  const Tensor cond = gt(rnd({3, 4}, 34), 0.0);
  expect_gradients_match([cond](const auto& in) { return where(cond, in[0], in[1]); },
                         {rnd({3, 4}, 35), rnd({1, 4}, 36)});
  expect_gradients_match([cond](const auto& in) { return masked_fill(in[0], cond, -7.0); },
                         {rnd({3, 4}, 37)});
}

TEST(GradCheckTest, Reductions) {
  const std::vector<Tensor> x = {rnd({3, 4, 5}, 40)};
  expect_gradients_match([](const auto& in) { return sum(in[0]); }, x);
  expect_gradients_match([](const auto& in) { return sum(in[0], {1}, true); }, x);
  expect_gradients_match([](const auto& in) { return sum(in[0], {0, 2}); }, x);
  expect_gradients_match([](const auto& in) { return mean(in[0], {-1}); }, x);
  expect_gradients_match([](const auto& in) { return mean(transpose(in[0], 0, 2), {0}); }, x);
  expect_gradients_match([](const auto& in) { return max(in[0], 1); }, x);
  expect_gradients_match([](const auto& in) { return min(in[0], 2, true); }, x);
  expect_gradients_match([](const auto& in) { return max(in[0]); }, x);
}

TEST(GradCheckTest, Views) {
  const std::vector<Tensor> x = {rnd({2, 3, 4}, 50)};
  expect_gradients_match([](const auto& in) { return reshape(in[0], {6, 4}); }, x);
  expect_gradients_match([](const auto& in) { return reshape(transpose(in[0], 1, 2), {-1}); }, x);
  expect_gradients_match([](const auto& in) { return permute(in[0], {2, 0, 1}); }, x);
  expect_gradients_match([](const auto& in) { return narrow(in[0], 2, 1, 2); }, x);
  expect_gradients_match([](const auto& in) { return select(in[0], 1, -1); }, x);
  expect_gradients_match([](const auto& in) { return unsqueeze(flatten(in[0], 1), 0); }, x);
  expect_gradients_match([](const auto& in) { return contiguous(transpose(in[0], 0, 2)); }, x);
  expect_gradients_match([](const auto& in) { return chunk(in[0], 2, 2)[1]; }, x);
  expect_gradients_match(
      [](const auto& in) {
        auto parts = split(in[0], 3, 2);
        return cat({parts[1], parts[0], in[1]}, 2);
      },
      {rnd({2, 3, 4}, 51), rnd({2, 3, 2}, 52)});
  expect_gradients_match(
      [](const auto& in) {
        return stack({in[0], in[1]}, 1);
      },
      {rnd({2, 3}, 53), rnd({2, 3}, 54)});
}

TEST(GradCheckTest, SoftmaxLogSoftmax) {
  const std::vector<Tensor> x = {rnd({3, 6}, 60)};
  expect_gradients_match([](const auto& in) { return softmax(in[0]); }, x);
  expect_gradients_match([](const auto& in) { return log_softmax(in[0]); }, x);
  expect_gradients_match([](const auto& in) { return softmax(in[0], 0); }, x);
  expect_gradients_match([](const auto& in) { return log_softmax(transpose(in[0], 0, 1), -1); }, x);
}

TEST(GradCheckTest, Norms) {
  expect_gradients_match([](const auto& in) { return layer_norm(in[0], in[1], in[2]); },
                         {rnd({4, 6}, 70), rnd({6}, 71), rnd({6}, 72)});
  expect_gradients_match(
      [](const auto& in) { return layer_norm(transpose(in[0], 0, 1), Tensor(), Tensor()); },
      {rnd({5, 3}, 73)});
  expect_gradients_match([](const auto& in) { return rms_norm(in[0], in[1]); },
                         {rnd({2, 3, 5}, 74), rnd({5}, 75)});
}

TEST(GradCheckTest, EmbeddingCrossEntropyDropout) {
  const Tensor idx = from_vector<int64_t>({3, 0, 3, 1, 4}, {5});
  expect_gradients_match([idx](const auto& in) { return embedding(in[0], idx); },
                         {rnd({5, 3}, 80)});
  const Tensor target = from_vector<int64_t>({2, -100, 0, 4}, {4});
  expect_gradients_match([target](const auto& in) { return cross_entropy(in[0], target); },
                         {rnd({4, 5}, 81)});
  expect_gradients_match(
      [target](const auto& in) { return cross_entropy(in[0], target, -100, Reduction::kNone); },
      {rnd({4, 5}, 82)});
  expect_gradients_match(
      [](const auto& in) {
        Generator gen(7);  // the same mask on every evaluation
        return dropout(in[0], 0.4, true, &gen);
      },
      {rnd({4, 8}, 83)});
}

TEST(GradCheckTest, MatmulBmmLinear) {
  expect_gradients_match([](const auto& in) { return matmul(in[0], in[1]); },
                         {rnd({3, 4}, 90), rnd({4, 2}, 91)});
  expect_gradients_match([](const auto& in) { return matmul(in[0], in[1]); },
                         {rnd({2, 3, 4}, 92), rnd({4, 5}, 93)});
  expect_gradients_match([](const auto& in) { return matmul(in[0], in[1]); },
                         {rnd({4}, 94), rnd({2, 4, 3}, 95)});
  expect_gradients_match([](const auto& in) { return matmul(in[0], in[1]); },
                         {rnd({4}, 96), rnd({4}, 97)});
  expect_gradients_match([](const auto& in) { return bmm(in[0], transpose(in[1], 1, 2)); },
                         {rnd({2, 3, 4}, 98), rnd({2, 5, 4}, 99)});
  // Attention-style: heads moved in front of time (non-contiguous batch dims).
  expect_gradients_match(
      [](const auto& in) {
        const Tensor q = permute(in[0], {0, 2, 1, 3});  // [B, H, T, D]
        return matmul(q, transpose(q, -1, -2));
      },
      {rnd({2, 3, 2, 4}, 100)});
  expect_gradients_match([](const auto& in) { return linear(in[0], in[1], in[2]); },
                         {rnd({2, 3, 4}, 101), rnd({5, 4}, 102), rnd({5}, 103)});
}

TEST(GradCheckTest, ToAndCustomFunction) {
  expect_gradients_match([](const auto& in) { return to(to(in[0], DType::kF16), DType::kF32); },
                         {uniform({3}, 1.0, 2.0, 110)}, 0.25, 0.05);
  expect_gradients_match(
      [](const auto& in) {
        return apply_function(
            "scaled_tanh", in,
            [](FunctionContext& ctx, const std::vector<Tensor>& x) {
              Tensor y = tanh(x[0]);
              ctx.save_for_backward({y});
              return std::vector<Tensor>{mul(y, 2.0)};
            },
            [](FunctionContext& ctx, const std::vector<Tensor>& g) {
              const Tensor y = ctx.saved_tensors()[0];
              return std::vector<Tensor>{mul(g[0], mul(sub(1.0, mul(y, y)), 2.0))};
            })[0];
      },
      {rnd({3, 4}, 111)});
}

}  // namespace
}  // namespace tessel
