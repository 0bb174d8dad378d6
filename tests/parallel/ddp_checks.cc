#include "tests/parallel/ddp_checks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::testing {
namespace {

const nn::optim::AdamWOptions kAdam{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1};

float loss_value(const Tensor& loss) { return to_vector<float>(loss)[0]; }

}  // namespace

nn::GptConfig ddp_gpt_config() {
  return {.vocab_size = 64, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32, .seed = 3};
}

Batch global_batch(int64_t step, int64_t batch, int64_t seq, int64_t vocab) {
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(step));
  std::vector<int64_t> x(batch * seq), y(batch * seq);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    const int64_t stride = 1 + static_cast<int64_t>(rng() % 3);
    for (int64_t t = 0; t < seq; ++t) {
      x[b * seq + t] = (start + stride * t) % vocab;
      y[b * seq + t] = (start + stride * (t + 1)) % vocab;
    }
  }
  return {from_vector<int64_t>(x, {batch, seq}), from_vector<int64_t>(y, {batch, seq})};
}

Batch slice_of(const Batch& b, int rank, int world) {
  const int64_t rows = b.x.size(0) / world;
  return {contiguous(narrow(b.x, 0, rank * rows, rows)),
          contiguous(narrow(b.y, 0, rank * rows, rows))};
}

std::vector<float> flat_grads(const nn::Module& m) {
  std::vector<float> out;
  for (const auto& [name, p] : m.named_parameters()) {
    const Tensor g = p.grad();
    const std::vector<float> v =
        g.defined() ? to_vector<float>(g) : std::vector<float>(static_cast<size_t>(p.numel()));
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> flat_params(const nn::Module& m) {
  std::vector<float> out;
  for (const Tensor& p : m.parameters()) {
    const std::vector<float> v = to_vector<float>(p);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return diff / scale;
}

Trajectory train_whole_batch(int64_t steps) {
  nn::GPT model(ddp_gpt_config());
  nn::optim::AdamW opt(model.parameters(), kAdam);
  Trajectory t;
  for (int64_t step = 0; step < steps; ++step) {
    const Batch b = global_batch(step);
    const Tensor loss = nn::GPT::loss(model(b.x), b.y);
    backward(loss);
    t.losses.push_back(loss_value(loss));
    t.grads.push_back(flat_grads(model));
    opt.step();
    opt.zero_grad();
  }
  t.params = flat_params(model);
  return t;
}

Trajectory train_accumulated(int world, int64_t steps) {
  nn::GPT model(ddp_gpt_config());
  nn::optim::AdamW opt(model.parameters(), kAdam);
  Trajectory t;
  for (int64_t step = 0; step < steps; ++step) {
    const Batch b = global_batch(step);
    float loss_sum = 0;
    for (int r = 0; r < world; ++r) {
      const Batch mine = slice_of(b, r, world);
      const Tensor loss = nn::GPT::loss(model(mine.x), mine.y);
      backward(loss);
      loss_sum = r == 0 ? loss_value(loss) : loss_sum + loss_value(loss);
    }
    for (const Tensor& p : model.parameters()) p.set_grad(div(p.grad(), double(world)));
    t.losses.push_back(loss_sum / static_cast<float>(world));
    t.grads.push_back(flat_grads(model));
    opt.step();
    opt.zero_grad();
  }
  t.params = flat_params(model);
  return t;
}

Trajectory train_replicated_rank(const std::shared_ptr<ProcessGroup>& world, int64_t steps,
                                 ReplicateOptions options) {
  DeviceMesh mesh = init_device_mesh(world, {world->size()}, {"dp"});
  nn::GPT model(ddp_gpt_config());
  DDPModule ddp = replicate(model, mesh, options);
  nn::optim::AdamW opt(model.parameters(), kAdam);
  Trajectory t;
  for (int64_t step = 0; step < steps; ++step) {
    const Batch mine = slice_of(global_batch(step), world->rank(), world->size());
    const Tensor loss = nn::GPT::loss(ddp(mine.x), mine.y);
    backward(loss);
    Tensor global = from_vector<float>({loss_value(loss)});
    world->all_reduce(global, {.op = ReduceOp::kAvg});
    t.losses.push_back(loss_value(global));
    t.grads.push_back(flat_grads(model));
    opt.step();
    opt.zero_grad();
  }
  t.params = flat_params(model);
  t.synced_backwards = ddp.stats().synced_backwards;
  return t;
}

}  // namespace tessel::testing
