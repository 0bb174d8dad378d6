// Expert parallelism (parallel/ep/) on rank threads against one process: an MoE Llama trained
// 20 AdamW steps with its experts over ep = 1 (3 ranks), 2 and 4 ranks (ep carved from dp_shard,
// the experts FSDP-sharded over what remains, the dense layers FSDP over all of dp_shard, and
// once with tensor parallelism on the dense layers) gives the one-process loss at every step
// (f32, relative 1e-5: the reductions reorder sums), the same first-step gradient of every
// parameter, and routes exactly as one process does (every step's per-expert counts equal, the
// same balancing bias on every rank). Also: the all-to-all of uneven row splits and its
// backward; bad input (experts that do not divide over ep, top_k above the expert count, ep that
// does not divide the mesh, a capacity factor) refused on every rank before any collective; and
// a checkpoint saved at ep = 4 resuming at ep = 2.
#include "tessel/parallel/ep/expert_parallel.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/llama.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/tp/llama_plan.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/parallel/tp/parallelize.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/checkpoint_test_util.h"

namespace tessel {
namespace {

constexpr int64_t kBatch = 12;  // global batch (sequences): splits over 1, 2, 3 and 4 ranks
constexpr int64_t kSeq = 8;
constexpr int kSteps = 20;
constexpr double kTol = 1e-5;

// tiny_moe() made smaller: vocab 64, width 32, layer 0 dense, layer 1 MoE with 8 sigmoid-scored
// experts of hidden 16, top-2, one shared expert, bias balancing and the aux loss.
nn::LlamaConfig config_of(int64_t experts = 8, int64_t top_k = 2) {
  nn::LlamaConfig c = nn::LlamaConfig::tiny_moe();
  c.vocab_size = 64;
  c.dim = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden_size = 48;
  c.max_seq_len = kSeq;
  c.seed = 7;
  c.moe->num_experts = experts;
  c.moe->top_k = top_k;
  c.moe->hidden_dim = 16;
  return c;
}

std::pair<Tensor, Tensor> batch_of(int step, int64_t vocab) {
  Generator gen(500 + step);
  const Tensor start = to(mul(rand({kBatch, 1}, gen), static_cast<double>(vocab)), DType::kI64);
  Tensor tokens = contiguous(add(start, unsqueeze(mul(arange(kSeq + 1), 3.0), 0)));
  int64_t* t = tokens.data<int64_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) t[i] %= vocab;
  return {narrow(tokens, 1, 0, kSeq), narrow(tokens, 1, 1, kSeq)};
}

struct Record {
  std::vector<double> losses;                // every step's global loss (NaN: not run)
  std::vector<std::vector<int64_t>> counts;  // every step's per-expert counts (the MoE layer)
  std::map<std::string, Tensor> grads;       // step 0, whole
  ExpertParallelStats stats;
};

nn::optim::AdamWOptions adamw() { return {.lr = 1e-2, .weight_decay = 0.1}; }

// The training step both runs share: loss = cross-entropy + aux, backward, clip, AdamW, the
// balancing bias from the step's (global) counts.
template <typename Clip>
double step_of(nn::Llama& model, nn::optim::AdamW& opt, const Tensor& x, const Tensor& y,
               const Clip& clip, Record& run, int step,
               const std::function<void()>& after_backward = {}, const DeviceMesh* tp = nullptr) {
  const nn::Tensors out = model(nn::Tensors{x});
  // Under tensor parallelism the logits are this rank's vocabulary columns.
  const Tensor ce = tp ? loss_parallel_cross_entropy(out[0], y, *tp, model.config().vocab_size)
                       : nn::Llama::loss(out[0], y);
  const Tensor loss = add(ce, out[1]);
  backward(loss);
  if (after_backward && step == 0) after_backward();
  clip(model.parameters(), 1.0);
  opt.step();
  opt.zero_grad();
  for (nn::MoE* moe : model.moe_layers()) moe->update_expert_bias();
  run.counts.push_back(model.moe_layers().back()->expert_counts());
  return item(loss);
}

Record train_single(const nn::LlamaConfig& config) {
  nn::Llama model(config);
  nn::optim::AdamW opt(model.parameters(), adamw());
  Record run;
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, y] = batch_of(step, config.vocab_size);
    run.losses.push_back(step_of(
        model, opt, x, y,
        [](const std::vector<Tensor>& p, double m) { nn::optim::clip_grad_norm(p, m); }, run, step,
        [&] {
          for (auto& [name, p] : model.named_parameters()) run.grads[name] = clone(p.grad());
        }));
  }
  return run;
}

struct Setup {
  int world;
  int64_t ep;
  int64_t tp = 1;
};

// One rank's model: experts over ep (carved from dp_shard = world), FSDP over efsdp for the
// experts and over dp_shard for everything else.
struct Parallel {
  std::unique_ptr<nn::Llama> model;
  ExpertParallel ep;
  int64_t dp_rank = 0, dp_size = 1;
  std::optional<DeviceMesh> tp;  // with tensor parallelism on the dense layers
};

// With tp > 1 the mesh is (dp_shard, tp): the dense layers split over tp by llama_tp_plan (the
// MoE layers' mlp stays whole on every tp rank), ep carved from dp_shard.
Parallel build(ProcessGroup& pg, const nn::LlamaConfig& config, int64_t ep, int64_t tp = 1) {
  const DeviceMesh mesh =
      tp > 1 ? init_device_mesh(pg.shared_from_this(), {pg.size() / tp, tp}, {"dp_shard", "tp"})
             : init_device_mesh(pg.shared_from_this(), {pg.size()}, {"dp_shard"});
  const DeviceMesh moe_mesh = carve_ep_mesh(mesh, ep);
  Parallel p;
  p.model = std::make_unique<nn::Llama>(config);
  if (tp > 1) {
    p.tp = mesh["tp"];
    parallelize_module(*p.model, *p.tp, llama_tp_plan({}));
  }
  p.ep = parallelize_experts(*p.model, moe_mesh);
  const DeviceMesh dp = moe_mesh.flatten({"efsdp", "ep"}, "dp_shard")["dp_shard"];
  for (nn::MoE* moe : p.ep.layers()) fully_shard(moe->child("experts"), moe_mesh["efsdp"]);
  for (auto& [name, layer] : p.model->submodule("model.layers").children()) {
    fully_shard(*layer, dp);
  }
  fully_shard(*p.model, dp);
  p.dp_rank = dp.local_rank();
  p.dp_size = dp.size();
  return p;
}

// Trains steps [first, kSteps) on every rank of `pg`, loading `load_from` first and saving after
// step `save_at` into `save_to` when given; rank 0's record is returned through `out`.
void train_rank(ProcessGroup& pg, const nn::LlamaConfig& config, int64_t ep, Record* out,
                const std::string& load_from = "", const std::string& save_to = "",
                int save_at = -1, int64_t tp = 1,
                std::vector<std::vector<float>>* biases = nullptr) {
  Parallel p = build(pg, config, ep, tp);
  nn::Llama& model = *p.model;
  const nn::StateDict whole = nn::Llama(config).state_dict();
  nn::optim::AdamW opt(model.parameters(), adamw());
  checkpoint::CheckpointState state(pg.shared_from_this());
  state.add_model("model", model);
  state.add_optimizer("optim", opt, model);
  if (!load_from.empty()) checkpoint::load(state, load_from);
  const int64_t rows = kBatch / p.dp_size;
  Record run;
  run.losses.assign(static_cast<size_t>(state.step), std::nan(""));
  run.counts.resize(static_cast<size_t>(state.step));
  for (int step = static_cast<int>(state.step); step < kSteps; ++step) {
    const auto [x, y] = batch_of(step, config.vocab_size);
    const double loss = step_of(
        model, opt, narrow(x, 0, p.dp_rank * rows, rows), narrow(y, 0, p.dp_rank * rows, rows),
        [](const std::vector<Tensor>& params, double m) { clip_grad_norm(params, m); }, run, step,
        [&] {
          if (!load_from.empty()) return;
          NoGradGuard no_grad;
          for (auto& [name, t] : model.named_parameters()) {
            const Shape shape = whole.at(name).shape();
            run.grads[name] =
                clone(reshape(DTensor(t.grad(), as_dtensor(t).spec()).full_tensor(), shape));
          }
        },
        p.tp ? &*p.tp : nullptr);
    Tensor mean = from_vector<float>({static_cast<float>(loss)});
    pg.all_reduce(mean, {.op = ReduceOp::kAvg});
    run.losses.push_back(item(mean));
    if (step + 1 == save_at && !save_to.empty()) {
      state.step = step + 1;
      checkpoint::save(state, save_to);
    }
  }
  run.stats = p.ep.stats();
  if (biases != nullptr) {  // every rank's balancing bias after the last step
    (*biases)[pg.rank()] = to_vector<float>(model.moe_layers().back()->buffer("expert_bias"));
  }
  if (pg.rank() == 0) *out = std::move(run);
}

double max_abs(const Tensor& t) { return item(max(abs(t))); }

void expect_parity(const Record& got, const Record& want, size_t from = 0) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = from; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], kTol * want.losses[i]) << "step " << i;
    EXPECT_EQ(got.counts[i], want.counts[i]) << "per-expert counts (routing), step " << i;
  }
}

const Record& reference() {
  static const Record run = train_single(config_of());
  return run;
}

void expect_matches_one_process(const Setup& s) {
  const Record& want = reference();
  ASSERT_LT(want.losses.back(), want.losses.front() - 0.5) << "the data teaches nothing";
  Record got;
  std::vector<std::vector<float>> biases(static_cast<size_t>(s.world));
  threads::run_ranks(s.world, [&](ProcessGroup& pg) {
    train_rank(pg, config_of(), s.ep, &got, "", "", -1, s.tp, &biases);
  });
  expect_parity(got, want);
  // Every rank routes alike: the same bias (moved by the same counts) everywhere, not zero.
  EXPECT_NE(biases[0], std::vector<float>(biases[0].size(), 0.0f));
  for (int r = 1; r < s.world; ++r) EXPECT_EQ(biases[r], biases[0]) << "rank " << r;
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (const auto& [name, w] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << name;
    EXPECT_LE(max_abs(sub(got.grads.at(name), w)), kTol * max_abs(w)) << name;
  }
  // Per step and MoE layer: the counts' all_to_all and the rows' there and back, forward and
  // backward (none with one ep rank).
  EXPECT_EQ(got.stats.all_to_alls, s.ep > 1 ? kSteps * 5 : 0);
  if (s.ep > 1) {
    EXPECT_GT(got.stats.bytes_sent, 0);
  }
}

TEST(ExpertParallelTest, OneRankMatchesOneProcess) { expect_matches_one_process({1, 1}); }

TEST(ExpertParallelTest, Ep2MatchesOneProcess) { expect_matches_one_process({2, 2}); }

// ep = 1 under FSDP over 3 ranks (an odd world): no exchange, the counts summed over the ranks,
// so routing and the bias stay those of one process.
TEST(ExpertParallelTest, Ep1UnderDataParallelismOnThreeRanksMatchesOneProcess) {
  expect_matches_one_process({3, 1});
}

TEST(ExpertParallelTest, Ep4MatchesOneProcess) { expect_matches_one_process({4, 4}); }

// (efsdp, ep) = (2, 2) over the same 4 ranks: the experts FSDP-sharded over efsdp.
TEST(ExpertParallelTest, Ep2TimesEfsdp2MatchesOneProcess) { expect_matches_one_process({4, 2}); }

// Mesh (dp_shard 2, tp 2) with ep carved from dp_shard: attention and the dense MLP split over
// tp, the experts over ep.
TEST(ExpertParallelTest, Ep2WithTp2OnTheDenseLayersMatchesOneProcess) {
  expect_matches_one_process({4, 2, 2});
}

TEST(ExpertParallelTest, CheckpointSavedAtEp4ResumesAtEp2) {
  testing::TempDir dir;
  const nn::LlamaConfig config = config_of();
  constexpr int kSaveAt = 8;
  Record whole, resumed;
  threads::run_ranks(
      4, [&](ProcessGroup& pg) { train_rank(pg, config, 4, &whole, "", dir / "ep4", kSaveAt); });
  threads::run_ranks(4,
                     [&](ProcessGroup& pg) { train_rank(pg, config, 2, &resumed, dir / "ep4"); });
  expect_parity(resumed, whole, kSaveAt);
  // The resumed run routes as the uninterrupted one (and so as one process) from its first step.
  expect_parity(resumed, reference(), kSaveAt);
}

TEST(ExpertParallelTest, AllToAllRowsMovesUnevenSplitsAndTheirGradients) {
  // Rank i sends (i + j) % 3 rows to rank j (some zero); row values name (source, index).
  constexpr int kWorld = 3;
  threads::run_ranks(kWorld, [](ProcessGroup& pg) {
    const int me = pg.rank();
    std::vector<int64_t> send(kWorld), recv(kWorld);
    for (int j = 0; j < kWorld; ++j) {
      send[j] = (me + j) % 3;
      recv[j] = (j + me) % 3;
    }
    int64_t rows = 0;
    for (int64_t n : send) rows += n;
    Tensor x = add(arange(rows * 2, DType::kF32), 100.0 * me);
    x.set_requires_grad(true);
    const Tensor xr = reshape(x, {rows, 2});
    const Tensor got = all_to_all_rows(xr, pg.shared_from_this(), send, recv);
    // Expected: from each source s, the block of s's rows addressed to me.
    std::vector<float> want;
    for (int s = 0; s < kWorld; ++s) {
      int64_t before = 0;
      for (int j = 0; j < me; ++j) before += (s + j) % 3;
      for (int64_t r = 0; r < (s + me) % 3; ++r) {
        for (int c = 0; c < 2; ++c)
          want.push_back(static_cast<float>(100 * s + (before + r) * 2 + c));
      }
    }
    EXPECT_EQ(to_vector<float>(contiguous(got)), want) << "rank " << me;
    // d(sum(got * (rank + 1))) / dx: every row comes back scaled by its receiver's rank + 1.
    backward(sum(mul(got, static_cast<double>(me + 1))));
    std::vector<float> grad;
    for (int j = 0; j < kWorld; ++j) {
      for (int64_t r = 0; r < send[j] * 2; ++r) grad.push_back(static_cast<float>(j + 1));
    }
    EXPECT_EQ(to_vector<float>(x.grad()), grad) << "rank " << me;
  });
}

// Runs `fn` on every rank of a `world`-rank job and expects it to throw InvalidArgument with
// `text` in the message on every rank, before any collective of the world.
void expect_refused_everywhere(int world, const std::string& text,
                               const std::function<void(ProcessGroup&)>& fn) {
  std::vector<std::string> messages(world);
  std::vector<uint64_t> seqs(world);
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    try {
      fn(pg);
    } catch (const InvalidArgument& e) {
      messages[pg.rank()] = e.what();
    }
    seqs[pg.rank()] = pg.seq();
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_NE(messages[r].find(text), std::string::npos) << "rank " << r << ": " << messages[r];
    EXPECT_EQ(seqs[r], 0u) << "rank " << r << " communicated before the error";
  }
}

TEST(ExpertParallelTest, BadInputIsRefusedOnEveryRankBeforeAnyCollective) {
  // 6 experts over ep = 4.
  expect_refused_everywhere(4, "6 experts of layer 'model.layers.1.mlp' do not divide over ep = 4",
                            [](ProcessGroup& pg) { build(pg, config_of(6), 4); });
  // top_k above the expert count (the model itself refuses it).
  expect_refused_everywhere(2, "top_k must be in 1..num_experts (8), got 9",
                            [](ProcessGroup& pg) { build(pg, config_of(8, 9), 2); });
  // ep that does not divide the mesh.
  expect_refused_everywhere(4, "ep = 3 does not divide mesh dimension 'dp_shard' of 4 ranks",
                            [](ProcessGroup& pg) { build(pg, config_of(6), 3); });
  // A capacity factor (expert parallelism is dropless).
  nn::LlamaConfig capped = config_of();
  capped.moe->capacity_factor = 1.25;
  expect_refused_everywhere(2, "expert parallelism is dropless",
                            [&](ProcessGroup& pg) { build(pg, capped, 2); });
  // Experts already sharded by FSDP.
  expect_refused_everywhere(2, "apply expert parallelism before fully_shard", [](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"dp_shard"});
    nn::Llama model(config_of());
    fully_shard(model, mesh);
    parallelize_experts(model, carve_ep_mesh(mesh, 2));
  });
}

TEST(ExpertParallelTest, LoadImbalanceIsMaxOverMean) {
  EXPECT_DOUBLE_EQ(nn::load_imbalance({4, 4, 4, 4}), 1.0);
  EXPECT_DOUBLE_EQ(nn::load_imbalance({8, 0, 0, 0}), 4.0);
  EXPECT_DOUBLE_EQ(nn::load_imbalance({6, 2}), 1.5);
  EXPECT_DOUBLE_EQ(nn::load_imbalance({}), 0.0);
  EXPECT_DOUBLE_EQ(nn::load_imbalance({0, 0}), 0.0);
}

}  // namespace
}  // namespace tessel
