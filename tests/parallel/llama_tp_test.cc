// The tensor-parallel plan of nn::Llama (llama_tp_plan) on rank threads against one process:
// the first step's logits (gathered over the vocabulary split) and every parameter's gradient,
// and the loss of every step over 8 AdamW steps, for grouped-query (4 heads, 2 K/V heads) and
// multi-head attention, untied and tied embeddings, tp 2 with and without sequence parallelism
// and FSDP x TP 2 x 2. Tolerances: f32 relative 1e-5 (the tp all_reduces reorder sums) of each
// step's loss, of the largest logit and of each gradient's largest entry. Also: K/V heads that
// do not divide over tp are refused by name, and Hugging Face fixtures load into an FSDP x TP
// Llama with the single-process logits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/hf_format.h"
#include "tessel/nn/llama.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/tp/llama_plan.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/safetensors.h"

namespace tessel {
namespace {

constexpr int64_t kBatch = 8;  // global batch (sequences)
constexpr int64_t kSeq = 16;
constexpr int kSteps = 8;
constexpr double kTol = 1e-5;

// Vocabulary 66 (33 + 33 over 2 ranks), width 32, 2 layers, 4 heads of 8, hidden 48.
nn::LlamaConfig config_of(int64_t kv_heads, bool tied) {
  nn::LlamaConfig c;
  c.vocab_size = 66;
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = kv_heads;
  c.ffn_hidden_size = 48;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.max_seq_len = kSeq;
  c.seed = 5;
  return c;
}

// The global batch of `step`: sequences counting up by 5 from a random start, so the loss falls.
std::pair<Tensor, Tensor> batch_of(int step, int64_t vocab) {
  Generator gen(300 + step);
  const Tensor start = to(mul(rand({kBatch, 1}, gen), static_cast<double>(vocab)), DType::kI64);
  Tensor tokens = contiguous(add(start, unsqueeze(mul(arange(kSeq + 1), 5.0), 0)));
  int64_t* t = tokens.data<int64_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) t[i] %= vocab;
  return {narrow(tokens, 1, 0, kSeq), narrow(tokens, 1, 1, kSeq)};
}

struct Run {
  std::vector<double> losses;           // every step's global loss
  Tensor first_logits;                  // step 0, this run's rows, the whole vocabulary
  std::map<std::string, Tensor> grads;  // step 0, whole
};

nn::optim::AdamWOptions adamw() { return {.lr = 1e-2, .weight_decay = 0.1}; }

Run train_single(const nn::LlamaConfig& config) {
  nn::Llama model(config);
  nn::optim::AdamW opt(model.parameters(), adamw());
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, y] = batch_of(step, config.vocab_size);
    const Tensor logits = model(x);
    const Tensor loss = nn::Llama::loss(logits, y);
    backward(loss);
    if (step == 0) {
      run.first_logits = detach(logits);
      for (auto& [name, p] : model.named_parameters()) run.grads[name] = clone(p.grad());
    }
    nn::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    run.losses.push_back(item(loss));
  }
  return run;
}

struct Setup {
  std::vector<int64_t> shape;      // of the mesh
  std::vector<std::string> names;  // "tp" last, "dp_shard" before it
  bool sequence_parallel = false;
};

// One rank's run: llama_tp_plan over mesh["tp"], then FSDP per layer and at the root over
// dp_shard (when the mesh has it). Every rank of the world calls it.
Run train_parallel(ProcessGroup& pg, const nn::LlamaConfig& config, const Setup& s) {
  const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), s.shape, s.names);
  nn::Llama model(config);
  parallelize_module(model, mesh["tp"],
                     llama_tp_plan({.sequence_parallel = s.sequence_parallel,
                                    .tie_word_embeddings = config.tie_word_embeddings}));
  int64_t dp_size = 1, dp_rank = 0;
  if (s.names.front() == "dp_shard") {
    const DeviceMesh dp = mesh["dp_shard"];
    for (auto& [name, layer] : model.submodule("model.layers").children()) {
      fully_shard(*layer, dp);
    }
    fully_shard(model, dp);
    dp_size = dp.size();
    dp_rank = mesh.local_rank("dp_shard");
  }
  const nn::StateDict whole = nn::Llama(config).state_dict();
  nn::optim::AdamW opt(model.parameters(), adamw());
  const int64_t rows = kBatch / dp_size;
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, y] = batch_of(step, config.vocab_size);
    const Tensor logits = model(narrow(x, 0, dp_rank * rows, rows));  // this rank's vocabulary
    const Tensor loss = loss_parallel_cross_entropy(logits, narrow(y, 0, dp_rank * rows, rows),
                                                    mesh["tp"], config.vocab_size);
    backward(loss);
    if (step == 0) {
      NoGradGuard no_grad;
      run.first_logits = prepare_layout(detach(logits), mesh["tp"], Shard{-1}, Replicate{});
      for (auto& [name, p] : model.named_parameters()) {
        const Shape shape = whole.at(name).shape();
        run.grads[name] =
            is_dtensor(p)
                ? clone(reshape(DTensor(p.grad(), as_dtensor(p).spec()).full_tensor(), shape))
                : clone(p.grad());
      }
    }
    clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    Tensor mean = from_vector<float>({static_cast<float>(item(loss))});
    pg.all_reduce(mean, {.op = ReduceOp::kAvg});
    run.losses.push_back(item(mean));
  }
  return run;
}

double max_abs(const Tensor& t) { return item(max(abs(t))); }

void expect_parity(const nn::LlamaConfig& config, const Setup& setup) {
  const Run want = train_single(config);
  ASSERT_LT(want.losses.back(), want.losses.front() - 0.5) << "the data teaches nothing";
  int world = 1;
  for (int64_t n : setup.shape) world *= static_cast<int>(n);
  Run got;
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    Run run = train_parallel(pg, config, setup);
    if (pg.rank() == 0) got = std::move(run);
  });
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], kTol * want.losses[i]) << "step " << i;
  }
  // Rank 0 holds the first rows of the global batch (all of them without dp).
  const Tensor want_logits = narrow(want.first_logits, 0, 0, got.first_logits.size(0));
  EXPECT_LE(max_abs(sub(got.first_logits, want_logits)), kTol * max_abs(want_logits));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (const auto& [name, w] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << name;
    const Tensor& g = got.grads.at(name);
    ASSERT_EQ(g.shape(), w.shape()) << name;
    EXPECT_LE(max_abs(sub(g, w)), kTol * max_abs(w)) << name;
  }
}

TEST(LlamaTpTest, GroupedQueryUntiedMatchesOneProcess) {
  expect_parity(config_of(2, false), {{2}, {"tp"}});
}

TEST(LlamaTpTest, GroupedQueryUntiedSequenceParallelMatchesOneProcess) {
  expect_parity(config_of(2, false), {{2}, {"tp"}, /*sequence_parallel=*/true});
}

TEST(LlamaTpTest, MultiHeadTiedMatchesOneProcess) {
  expect_parity(config_of(4, true), {{2}, {"tp"}});
  SCOPED_TRACE("sequence parallel");
  expect_parity(config_of(4, true), {{2}, {"tp"}, true});
}

TEST(LlamaTpTest, FsdpTimesTensorParallelMatchesOneProcess) {
  expect_parity(config_of(2, false), {{2, 2}, {"dp_shard", "tp"}, true});
  SCOPED_TRACE("tied, no sequence parallelism");
  expect_parity(config_of(2, true), {{2, 2}, {"dp_shard", "tp"}});
}

TEST(LlamaTpTest, KeyValueHeadsThatDoNotDivideOverTpAreRefused) {
  std::vector<std::string> errors(4);
  threads::run_ranks(4, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {4}, {"tp"});
    nn::Llama model(config_of(2, false));
    try {
      parallelize_module(model, mesh, llama_tp_plan());
    } catch (const InvalidArgument& e) {
      errors[pg.rank()] = e.message();
    }
    // Nothing changed: the model still runs whole.
    EXPECT_EQ(model.parameter("model.layers.0.self_attn.k_proj.weight").shape(), (Shape{16, 32}));
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("'model.layers.0.self_attn' has 2 key/value heads"), std::string::npos) << e;
    EXPECT_NE(e.find("4 ranks"), std::string::npos) << e;
  }
}

// Hugging Face fixtures (tests/nn/hf) loaded into FSDP x TP 2 x 2: each rank reads its shards
// (fewer bytes than the files hold) and the logits equal the single-process model's.
TEST(LlamaTpTest, HuggingFaceFolderLoadsIntoFsdpTimesTp) {
  for (const std::string name : {"llama_gqa_untied", "llama_gqa_tied_llama3"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(TESSEL_HF_FIXTURE_DIR) + "/" + name;
    const Tensor ids = load_safetensors(dir + "/io.safetensors").tensors.at("input_ids");
    nn::HfModel whole = nn::load_hf_model(dir);
    Tensor expected;
    {
      NoGradGuard no_grad;
      expected = (*whole.model)(ids);
    }
    std::vector<double> diffs(4, -1);
    std::vector<uint64_t> read(4, 0);
    uint64_t in_files = 0;
    threads::run_ranks(4, [&](ProcessGroup& pg) {
      const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp_shard", "tp"});
      const nn::HfConfig config = nn::read_hf_config(dir);
      std::unique_ptr<nn::Llama> model;
      {
        DefaultDeviceGuard meta(Device::meta());
        model = std::make_unique<nn::Llama>(config.llama);
      }
      parallelize_module(*model, mesh["tp"],
                         llama_tp_plan({.tie_word_embeddings = config.llama.tie_word_embeddings}));
      for (auto& [n, layer] : model->submodule("model.layers").children()) {
        fully_shard(*layer, mesh["dp_shard"]);
      }
      fully_shard(*model, mesh["dp_shard"]);
      model->to_empty(Device::cpu());
      const nn::HfLoadStats stats = nn::load_hf_weights(*model, dir);
      read[pg.rank()] = stats.bytes_read;
      if (pg.rank() == 0) in_files = stats.bytes_in_files;
      NoGradGuard no_grad;
      const Tensor logits = prepare_layout((*model)(ids), mesh["tp"], Shard{-1}, Replicate{});
      diffs[pg.rank()] = max_abs(sub(logits, expected));
    });
    for (int r = 0; r < 4; ++r) {
      EXPECT_LE(diffs[r], kTol * max_abs(expected)) << "rank " << r;
      EXPECT_LT(read[r], in_files) << "rank " << r << " read only its shards";
    }
  }
}

}  // namespace
}  // namespace tessel
