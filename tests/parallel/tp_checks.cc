#include "tests/parallel/tp_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/cp/gpt_cp.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/ddp.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::testing {
namespace {

constexpr int64_t kBatch = 8;  // global batch (sequences); every dp size here divides it

// The global batch of step `step`, the same on every rank: sequences that count up in steps of
// 5 from a random start, so the loss falls (on random tokens it stays at ln V and hides bugs).
std::pair<Tensor, Tensor> batch_of(int step) {
  const nn::GptConfig c = tp_gpt_config();
  Generator gen(200 + step);
  const Tensor start =
      to(mul(rand({kBatch, 1}, gen), static_cast<double>(c.vocab_size)), DType::kI64);
  Tensor tokens = contiguous(add(start, unsqueeze(mul(arange(c.block_size + 1), 5.0), 0)));
  int64_t* t = tokens.data<int64_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) t[i] %= c.vocab_size;
  return {narrow(tokens, 1, 0, c.block_size), narrow(tokens, 1, 1, c.block_size)};
}

nn::optim::AdamWOptions adamw() { return {.lr = 1e-2, .weight_decay = 0.1}; }

// The whole gradient of parameter p in `shape`, gathered over its mesh when it is a DTensor
// (collective); a copy, as clipping scales gradients in place.
Tensor whole_grad(const Tensor& p, const Shape& shape) {
  if (!is_dtensor(p)) return clone(p.grad());
  return clone(reshape(DTensor(p.grad(), as_dtensor(p).spec()).full_tensor(), shape));
}

}  // namespace

nn::GptConfig tp_gpt_config() {
  return {.vocab_size = 66, .block_size = 16, .n_layer = 2, .n_head = 4, .n_embd = 32, .seed = 3};
}

TpRun train_single_process(int steps, Device device) {
  nn::GPT model(tp_gpt_config());
  model.to(device);
  nn::optim::AdamW opt(model.parameters(), adamw());
  TpRun run;
  for (int step = 0; step < steps; ++step) {
    const auto [x, y] = batch_of(step);
    const Tensor loss = nn::GPT::loss(model(to(x, device)), to(y, device));
    backward(loss);
    if (step == 0) {
      for (auto& [name, p] : model.named_parameters()) run.first_grads[name] = clone(p.grad());
    }
    nn::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    run.losses.push_back(static_cast<float>(item(loss)));
  }
  return run;
}

TpRun train_tensor_parallel(const std::shared_ptr<ProcessGroup>& world, const TpSetup& s) {
  const nn::GptConfig config = tp_gpt_config();
  DeviceMesh mesh = init_device_mesh(world, s.shape, s.names);
  nn::GPT model(config);
  model.to(s.device);  // initialised on the CPU: the same values on every device
  // Context parallelism first (it keeps the attention's children for the TP plan to replace).
  const bool cp = std::find(s.names.begin(), s.names.end(), "cp") != s.names.end();
  const parallel::CpLayout layout =
      parallel::cp_layout_load_balanced(config.block_size, cp ? mesh.size("cp") : 1);
  if (cp) parallel::apply_gpt_context_parallel(model, mesh.group("cp"), layout);
  parallelize_module(
      model, mesh["tp"],
      gpt_tp_plan({.sequence_parallel = s.sequence_parallel, .overlap_chunks = s.overlap_chunks}));
  const std::vector<std::string> fsdp_dims(s.names.begin(), s.names.end() - 1);
  int64_t dp_size = 1, dp_rank = 0;
  std::optional<DDPModule> ddp;  // s.ddp: the gradients averaged by DDP instead
  if (!fsdp_dims.empty()) {
    // FSDP shards over dp_shard and cp flattened together, as torchtitan folds them.
    const DeviceMesh dp = cp && fsdp_dims.size() > 1
                              ? mesh.flatten(fsdp_dims, "dp_shard_cp")["dp_shard_cp"]
                              : mesh.slice(fsdp_dims);
    if (s.ddp) {
      ddp.emplace(replicate(model, dp));
    } else {
      for (int64_t i = 0; i < config.n_layer; ++i) {
        fully_shard(model.submodule("transformer.h").child(std::to_string(i)), dp);
      }
      fully_shard(model, dp);
    }
    for (const std::string& d : fsdp_dims) {
      if (d == "cp") continue;  // cp ranks hold slices of the same sequences
      dp_rank = dp_rank * mesh.size(d) + mesh.local_rank(d);
      dp_size *= mesh.size(d);
    }
  }
  const nn::StateDict whole = nn::GPT(config).state_dict();  // the whole parameters' shapes
  nn::optim::AdamW opt(model.parameters(), adamw());
  const int64_t rows = kBatch / dp_size;
  TpRun run;
  for (int step = 0; step < s.steps; ++step) {
    const auto [x, y] = batch_of(step);
    const parallel::CpBatch b = parallel::cp_shard_batch(narrow(x, 0, dp_rank * rows, rows),
                                                         narrow(y, 0, dp_rank * rows, rows), layout,
                                                         cp ? mesh.local_rank("cp") : 0);
    const Tensor logits = model(to(b.tokens, s.device));
    const Tensor loss = mul(
        loss_parallel_cross_entropy(logits, to(b.targets, s.device), mesh["tp"], config.vocab_size),
        b.loss_scale);
    backward(loss);
    if (step == 0) {
      for (auto& [name, p] : model.named_parameters()) {
        run.first_grads[name] = whole_grad(p, whole.at(name).shape());
      }
    }
    clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    Tensor mean = to(from_vector<float>({static_cast<float>(item(loss))}), world->default_device());
    world->all_reduce(mean, {.op = ReduceOp::kAvg});  // tp ranks agree; dp slices averaged
    run.losses.push_back(static_cast<float>(item(mean)));
  }
  return run;
}

TpRun train_tensor_parallel_threads(const TpSetup& setup) {
  int world = 1;
  for (int64_t n : setup.shape) world *= static_cast<int>(n);
  TpRun got;
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    TpRun run = train_tensor_parallel(pg.shared_from_this(), setup);
    if (pg.rank() == 0) got = std::move(run);
  });
  return got;
}

std::string threads_parity_error(const TpSetup& setup) {
  static std::map<int, TpRun> singles;  // by step count; tests run one at a time
  auto it = singles.find(setup.steps);
  if (it == singles.end()) {
    it = singles.emplace(setup.steps, train_single_process(setup.steps)).first;
  }
  return parity_error(train_tensor_parallel_threads(setup), it->second);
}

std::string parity_error(const TpRun& got, const TpRun& want, double loss_rtol, double grad_tol) {
  if (want.losses.back() > want.losses.front() - 1.0) {
    return fmt::format(
        "the single-process loss fell only from {} to {}: the data teaches "
        "nothing",
        want.losses.front(), want.losses.back());
  }
  if (got.losses.size() != want.losses.size()) return "the runs have different step counts";
  for (size_t i = 0; i < got.losses.size(); ++i) {
    if (std::abs(got.losses[i] - want.losses[i]) > loss_rtol * std::abs(want.losses[i])) {
      return fmt::format("step {}: loss {} but {} single-process", i, got.losses[i],
                         want.losses[i]);
    }
  }
  if (got.first_grads.size() != want.first_grads.size()) return "different parameters";
  for (const auto& [name, w] : want.first_grads) {
    const auto it = got.first_grads.find(name);
    if (it == got.first_grads.end()) return fmt::format("no gradient for {}", name);
    if (it->second.shape() != w.shape()) return fmt::format("{}: gradient shape differs", name);
    const Tensor g_cpu = to(it->second, Device::cpu()), w_cpu = to(w, Device::cpu());
    const double scale = item(max(abs(w_cpu)));
    const double err = item(max(abs(sub(g_cpu, w_cpu))));
    if (err > grad_tol * scale) {
      return fmt::format("{}: first-step gradient differs by {} (largest entry {})", name, err,
                         scale);
    }
  }
  return "";
}

}  // namespace tessel::testing
