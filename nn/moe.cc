#include "tessel/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "tessel/base/error.h"
#include "tessel/kernels/llama/swiglu.h"
#include "tessel/kernels/moe/grouped_matmul.h"
#include "tessel/nn/linear.h"
#include "tessel/nn/llama_layers.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

Tensor host_indices(const std::vector<int64_t>& values, Device device) {
  return tessel::to(from_vector<int64_t>(values), device);
}

// w in forward, scale * its gradient in backward.
Tensor scale_grad(const Tensor& w, double scale) {
  if (scale == 1.0) return w;
  return apply_function(
      "moe_scale_grad", {w},
      [](FunctionContext&, const std::vector<Tensor>& in) {
        return std::vector<Tensor>{view(in[0], in[0].shape())};
      },
      [scale](FunctionContext&, const std::vector<Tensor>& grad) {
        return std::vector<Tensor>{mul(grad[0], scale)};
      })[0];
}

}  // namespace

GroupedExperts::GroupedExperts(int64_t num_experts, int64_t dim, int64_t hidden_dim, Generator* gen)
    : Module("GroupedExperts") {
  const int64_t E = num_experts, C = dim, F = hidden_dim;
  // Kaiming-uniform bounds of the Linear layers they stand for (fan-in C, then F).
  auto init = [&](const Shape& shape, int64_t fan_in) {
    Tensor w = empty(shape);
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    uniform_(w, -bound, bound, gen);
    return w;
  };
  register_parameter("gate_proj", init({E, C, F}, C));
  register_parameter("up_proj", init({E, C, F}, C));
  register_parameter("down_proj", init({E, F, C}, F));
}

Tensors GroupedExperts::forward_multi(const Tensors& inputs) {
  const Tensor& gate = parameter("gate_proj");
  TESSEL_CHECK(inputs.size() == 2 && inputs[0].dim() == 2 && inputs[0].size(1) == gate.size(1) &&
                   inputs[1].dim() == 1 && inputs[1].dtype() == DType::kI64 &&
                   inputs[1].size(0) == gate.size(0) + 1,
               InvalidArgument,
               "GroupedExperts takes {{xs (M, {}), offsets ({}) i64}}, got {} inputs{}",
               gate.size(1), gate.size(0) + 1, inputs.size(),
               inputs.size() == 2 ? ": " + inputs[0].str() + ", " + inputs[1].str() : "");
  const std::vector<int64_t> offsets = to_vector<int64_t>(tessel::to(inputs[1], Device::cpu()));
  const Tensor& xs = inputs[0];
  const Tensor h = kernels::swiglu(
      kernels::grouped_matmul(xs, scale_grad(gate, grad_scale_), offsets),
      kernels::grouped_matmul(xs, scale_grad(parameter("up_proj"), grad_scale_), offsets));
  return {kernels::grouped_matmul(h, scale_grad(parameter("down_proj"), grad_scale_), offsets)};
}

double load_imbalance(const std::vector<int64_t>& counts) {
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (counts.empty() || total == 0) return 0.0;
  const double mean = static_cast<double>(total) / static_cast<double>(counts.size());
  return static_cast<double>(*std::max_element(counts.begin(), counts.end())) / mean;
}

void MoE::set_dispatcher(std::shared_ptr<MoEDispatcher> dispatcher) {
  TESSEL_CHECK(dispatcher == nullptr || options_.capacity_factor == 0, InvalidArgument,
               "MoE: capacity_factor {} is not supported with a dispatcher (expert parallelism "
               "is dropless: set it to 0)",
               options_.capacity_factor);
  child_as<GroupedExperts>("experts").set_grad_scale(dispatcher ? dispatcher->expert_grad_scale()
                                                                : 1.0);
  dispatcher_ = std::move(dispatcher);
}

MoE::MoE(const MoEOptions& options, Generator* gen) : Module("MoE"), options_(options) {
  const MoEOptions& o = options;
  TESSEL_CHECK(o.dim > 0 && o.hidden_dim > 0 && o.num_experts > 0, InvalidArgument,
               "MoE needs positive dim ({}), hidden_dim ({}) and num_experts ({})", o.dim,
               o.hidden_dim, o.num_experts);
  TESSEL_CHECK(o.top_k > 0 && o.top_k <= o.num_experts, InvalidArgument,
               "MoE: top_k must be in 1..num_experts ({}), got {}", o.num_experts, o.top_k);
  TESSEL_CHECK(o.shared_experts >= 0 && o.capacity_factor >= 0 && o.bias_update_speed >= 0 &&
                   o.aux_loss_coeff >= 0 && o.route_scale > 0,
               InvalidArgument,
               "MoE needs shared_experts ({}), capacity_factor ({}), bias_update_speed ({}) and "
               "aux_loss_coeff ({}) >= 0 and route_scale ({}) > 0",
               o.shared_experts, o.capacity_factor, o.bias_update_speed, o.aux_loss_coeff,
               o.route_scale);
  const int64_t E = o.num_experts, C = o.dim, F = o.hidden_dim;
  register_module("gate", std::make_shared<Linear>(LinearOptions{C, E, false}, gen));
  register_module("experts", std::make_shared<GroupedExperts>(E, C, F, gen));
  if (o.shared_experts > 0) {
    register_module("shared_experts", std::make_shared<LlamaMLP>(C, o.shared_experts * F, gen));
  }
  register_buffer("expert_bias", zeros({E}));
}

Tensors MoE::route(const Tensor& x) {
  TESSEL_CHECK(x.dim() == 2 && x.size(1) == options_.dim, InvalidArgument,
               "MoE::route expects x (N, {}), got {}", options_.dim, x.str());
  const int64_t N = x.size(0), E = options_.num_experts, k = options_.top_k;
  const Tensor logits = tessel::to(child("gate")(x), DType::kF32);
  const Tensor scores =
      options_.score == MoEScore::kSoftmax ? softmax(logits, -1) : sigmoid(logits);
  // Selection on the host: scores + bias, highest first, ties to the lower expert index.
  const std::vector<float> s = to_vector<float>(contiguous(detach(scores)));
  const std::vector<float> bias = to_vector<float>(buffer("expert_bias"));
  std::vector<int64_t> chosen(static_cast<size_t>(N * k)), flat(chosen.size());
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    std::iota(order.begin(), order.end(), 0);
    auto biased = [&](int64_t e) { return s[t * E + e] + bias[e]; };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
      return biased(a) > biased(b) || (biased(a) == biased(b) && a < b);
    });
    for (int64_t j = 0; j < k; ++j) {
      chosen[t * k + j] = order[j];
      flat[t * k + j] = t * E + order[j];
    }
  }
  // The combine weights: the chosen (unbiased) scores, differentiable through the gate.
  Tensor weights =
      reshape(embedding(reshape(scores, {N * E, 1}), host_indices(flat, x.device())), {N, k});
  if (options_.norm_topk) weights = div(weights, sum(weights, {1}, true));
  if (options_.route_scale != 1.0) weights = mul(weights, options_.route_scale);
  return {reshape(host_indices(chosen, x.device()), {N, k}), weights, scores};
}

Tensors MoE::forward_multi(const Tensors& inputs) {
  TESSEL_CHECK(inputs.size() == 1 && inputs[0].dim() >= 1 && inputs[0].size(-1) == options_.dim,
               InvalidArgument, "MoE takes {{x (..., {})}}, got {} inputs{}", options_.dim,
               inputs.size(), inputs.empty() ? "" : ", x " + inputs[0].str());
  const Tensor& x = inputs[0];
  const int64_t C = options_.dim, E = options_.num_experts, k = options_.top_k;
  const int64_t N = x.numel() / C;
  const Tensor x2 = reshape(x, {N, C});
  const Tensors routed = route(x2);
  const std::vector<int64_t> chosen = to_vector<int64_t>(tessel::to(routed[0], Device::cpu()));

  // Sort the N k assignments by expert (stable: token order within an expert), keeping at most
  // `capacity` per expert when one is set (never with a dispatcher).
  std::vector<int64_t> routed_counts(static_cast<size_t>(E), 0);
  for (int64_t e : chosen) ++routed_counts[e];
  int64_t capacity = N * k;
  if (options_.capacity_factor > 0) {
    capacity = static_cast<int64_t>(std::ceil(options_.capacity_factor * N * k / E));
  }
  std::vector<int64_t> local_counts(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e) local_counts[e] = std::min(routed_counts[e], capacity);
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + local_counts[e];
  const int64_t M = offsets[E];
  dropped_ = N * k - M;
  // The load the statistics, the aux loss and the bias see: the whole batch's.
  if (dispatcher_) routed_counts = dispatcher_->global_counts(routed_counts);
  counts_ = dispatcher_ ? routed_counts : local_counts;
  std::vector<int64_t> rows(static_cast<size_t>(M));  // sorted row -> token
  std::vector<int64_t> position(
      static_cast<size_t>(N * k));  // assignment -> sorted row (M: dropped)
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t a = 0; a < N * k; ++a) {
    const int64_t e = chosen[a];
    if (next[e] == offsets[e + 1]) {
      position[a] = M;
      continue;
    }
    rows[next[e]] = a / k;
    position[a] = next[e]++;
  }

  // Dispatch (to the ranks holding the experts, when a dispatcher is set), the experts' SwiGLU
  // as three grouped matmuls, combine back, then the weighted sum: every assignment reads its
  // expert's row (a dropped one the zero row appended at M).
  Tensor xs = embedding(x2, host_indices(rows, x.device()));
  std::vector<int64_t> expert_offsets = offsets;
  if (dispatcher_) xs = dispatcher_->dispatch(xs, local_counts, &expert_offsets);
  Tensor ys = child("experts")(Tensors{xs, from_vector<int64_t>(expert_offsets)})[0];
  if (dispatcher_) ys = dispatcher_->combine(ys);
  const Tensor padded = cat({ys, zeros({1, C}, ys.dtype(), ys.device())}, 0);
  const Tensor yk = reshape(embedding(padded, host_indices(position, x.device())), {N, k, C});
  Tensor y = sum(mul(yk, unsqueeze(tessel::to(routed[1], x.dtype()), 2)), {1});
  if (options_.shared_experts > 0) y = add(y, child("shared_experts")(x2));

  Tensor aux = zeros(Shape{}, DType::kF32, x.device());
  if (options_.aux_loss_coeff > 0) {
    // E * sum_e f_e P_e: f_e the fraction of the choices that picked e (before any capacity;
    // the whole batch's with a dispatcher), P_e the mean score of e over this rank's tokens.
    const int64_t choices = std::accumulate(routed_counts.begin(), routed_counts.end(), int64_t{0});
    std::vector<float> f(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      f[e] =
          static_cast<float>(routed_counts[e]) / static_cast<float>(std::max<int64_t>(choices, 1));
    }
    const Tensor p = mean(routed[2], {0});
    aux = mul(sum(mul(p, tessel::to(from_vector<float>(f), x.device()))),
              options_.aux_loss_coeff * static_cast<double>(E));
  }
  return {reshape(y, x.shape()), aux};
}

void MoE::update_expert_bias() {
  if (options_.bias_update_speed == 0 || counts_.empty()) return;
  const int64_t E = options_.num_experts;
  const double mean_load =
      static_cast<double>(std::accumulate(counts_.begin(), counts_.end(), int64_t{0})) / E;
  std::vector<float> step(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const double d = mean_load - static_cast<double>(counts_[e]);
    step[e] = static_cast<float>(options_.bias_update_speed * ((d > 0) - (d < 0)));
  }
  NoGradGuard no_grad;
  Tensor& bias = buffer("expert_bias");
  add_(bias, tessel::to(from_vector<float>(step), bias.device()));
}

}  // namespace tessel::nn
