#include "tests/parallel/fsdp_checks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::testing {
namespace {

nn::optim::AdamWOptions adamw() { return {.lr = 1e-2, .weight_decay = 0.1}; }

}  // namespace

nn::GptConfig fsdp_gpt_config() {
  return {.vocab_size = 64, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 30, .seed = 3};
}

std::pair<Tensor, Tensor> fsdp_batch_of(int step) {
  const nn::GptConfig config = fsdp_gpt_config();
  Generator gen(100 + step);
  const Tensor start = to(mul(rand({kFsdpBatch, 1}, gen), 64.0), DType::kI64);
  const Tensor steps = mul(arange(config.block_size + 1), 3.0);
  Tensor tokens = contiguous(add(start, unsqueeze(steps, 0)));
  int64_t* t = tokens.data<int64_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) t[i] %= 64;
  return {narrow(tokens, 1, 0, config.block_size), narrow(tokens, 1, 1, config.block_size)};
}

std::vector<float> train_single(int micro, Device device) {
  nn::GPT model(fsdp_gpt_config());
  model.to(device);
  nn::optim::AdamW opt(model.parameters(), adamw());
  std::vector<float> losses;
  for (int step = 0; step < kFsdpSteps; ++step) {
    const auto [x, y] = fsdp_batch_of(step);
    double total = 0;
    for (int m = 0; m < micro; ++m) {
      const int64_t rows = kFsdpBatch / micro;
      const Tensor loss = nn::GPT::loss(model(to(narrow(x, 0, m * rows, rows), device)),
                                        to(narrow(y, 0, m * rows, rows), device));
      backward(loss);
      total += item(loss) / micro;
    }
    nn::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    losses.push_back(static_cast<float>(total));
  }
  return losses;
}

std::vector<float> train_fsdp_rank(const std::shared_ptr<ProcessGroup>& world, const FsdpSetup& s) {
  const nn::GptConfig config = fsdp_gpt_config();
  DeviceMesh mesh = init_device_mesh(world, s.mesh_shape, s.mesh_names);
  nn::GPT model(config);
  model.to(s.device);  // initialised on the CPU: the same values on every device
  auto& blocks = model.submodule("transformer.h");
  for (size_t i = 0; i < static_cast<size_t>(config.n_layer); ++i) {
    fully_shard(blocks.child(std::to_string(i)), mesh, s.options);
  }
  FSDPModule& root = fully_shard(model, mesh, s.options);
  nn::optim::AdamW opt(model.parameters(), adamw());
  const int64_t per_rank = kFsdpBatch / world->size();
  std::vector<float> losses;
  for (int step = 0; step < kFsdpSteps; ++step) {
    const auto [x, y] = fsdp_batch_of(step);
    double total = 0;
    for (int m = 0; m < s.micro; ++m) {
      const bool last = m + 1 == s.micro;
      if (s.hsdp_accumulate) {
        root.set_requires_all_reduce(last);
      } else {
        root.set_requires_gradient_sync(last);
      }
      const int64_t rows = per_rank / s.micro;
      const int64_t start = world->rank() * per_rank + m * rows;
      Tensor loss;
      {
        std::optional<AutocastGuard> autocast;
        if (s.autocast) autocast.emplace(DType::kBF16);
        loss = nn::GPT::loss(model(to(narrow(x, 0, start, rows), s.device)),
                             to(narrow(y, 0, start, rows), s.device));
      }
      backward(loss);
      total += item(loss) / s.micro;
    }
    clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    Tensor mean = to(from_vector<float>({static_cast<float>(total)}), world->default_device());
    world->all_reduce(mean, {.op = ReduceOp::kAvg});
    losses.push_back(static_cast<float>(item(mean)));
  }
  return losses;
}

std::vector<float> train_fsdp(const FsdpSetup& s) {
  int world = 1;
  for (int64_t n : s.mesh_shape) world *= static_cast<int>(n);
  std::vector<float> losses;
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    std::vector<float> mine = train_fsdp_rank(pg.shared_from_this(), s);
    if (pg.rank() == 0) losses = std::move(mine);
  });
  return losses;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i])) << "step " << i;
  }
}

}  // namespace tessel::testing
