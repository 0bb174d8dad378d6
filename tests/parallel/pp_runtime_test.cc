// The pipeline runtime on rank threads: a tiny GPT split into stages (uniform, user-given and
// balanced layouts; virtual stages; uneven and empty stages) trains 20 steps with every built-in
// schedule for pp = 1 (virtual stages only), 2 and 4, and its losses match one process training
// the whole model on the whole batch. Zero-bubble's B leaves the linear layers' weight gradients to
// W (bit-identical to running B and W as one backward), except on FSDP stages. The activations each
// rank holds at once, counted by the runtime, equal the validator's peak (1F1B: at most p on stage
// 0). A malformed schedule, and ranks running different schedules, fail on every rank naming the
// problem.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/llama.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/pp/gpt_stage.h"
#include "tessel/parallel/pp/llama_stage.h"
#include "tessel/parallel/pp/runtime.h"
#include "tessel/parallel/pp/schedule_generate.h"
#include "tessel/parallel/pp/schedule_validate.h"
#include "tessel/parallel/pp/stage_layout.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/pp_checks.h"

namespace tessel::pp {
namespace {

constexpr int kSteps = 20;
// Relative, per step: the pipeline sums micro-batch gradients where one process takes the
// whole batch's, so f32 sums run in another order.
constexpr double kTolerance = 2e-4;

nn::GptConfig tiny_config() { return testing::tiny_gpt(6); }

using testing::adamw_options;
using testing::batch;
using testing::kBatch;
using testing::kMaxNorm;
using testing::kSeq;

// A pipeline runtime whose STEP clips over every stage and steps the AdamW it owns, as a
// training loop sets one up.
class Trainer {
 public:
  Trainer(std::shared_ptr<ProcessGroup> pp, const PipelineSchedule& schedule,
          std::vector<LocalStage> local, PipelineLoss loss, std::vector<std::string> tied,
          bool gather_once = true)
      : runtime_(std::move(pp), schedule, std::move(local), std::move(loss),
                 {.on_step =
                      [this] {
                        clip_grad_norm(runtime_, kMaxNorm);
                        opt_->step();
                      },
                  .tied_parameters = std::move(tied),
                  .fsdp_gather_once_per_step = gather_once}),
        opt_(std::make_unique<nn::optim::AdamW>(runtime_.parameters(), adamw_options())) {}
  PipelineRuntime& runtime() { return runtime_; }

 private:
  PipelineRuntime runtime_;
  std::unique_ptr<nn::optim::AdamW> opt_;
};

template <typename Stage>
std::vector<LocalStage> local_stages(const std::vector<std::shared_ptr<Stage>>& stages) {
  std::vector<LocalStage> local;
  for (auto& s : stages) local.push_back({s->stage(), s});
  return local;
}

// One process, the whole model, the whole batch: the losses every pipeline must match.
const std::vector<double>& reference_losses() {
  static const std::vector<double> losses = testing::one_process_losses(tiny_config(), kSteps);
  return losses;
}

struct PipelineRun {
  std::vector<double> losses;               // rank 0's, per step
  std::vector<int> peak_in_flight;          // per rank
  std::vector<int> peak_in_flight_stage0;   // per rank: its first local stage's peak
  int64_t recvs_posted_early = 0;           // over ranks
  std::vector<int64_t> buffers_after_step;  // rank p−1's allocations after each step
  bool ranks_agree = true;                  // every rank returned rank 0's loss
};

PipelineRun train(const PipelineSchedule& schedule, const std::vector<int>& layout,
                  int steps = kSteps) {
  const int p = schedule.num_ranks;
  PipelineRun run;
  run.peak_in_flight.assign(static_cast<size_t>(p), 0);
  run.peak_in_flight_stage0.assign(static_cast<size_t>(p), 0);
  std::vector<std::vector<double>> losses(static_cast<size_t>(p));
  std::mutex mu;
  threads::run_ranks(p, [&](ProcessGroup& pg) {
    const int rank = pg.rank();
    Trainer trainer(pg.shared_from_this(), schedule,
                    local_stages(make_gpt_stages(tiny_config(), layout, rank, p)), nn::GPT::loss,
                    gpt_tied_parameters());
    PipelineRuntime& runtime = trainer.runtime();
    std::vector<double> mine;
    std::vector<int64_t> buffers;
    for (int step = 0; step < steps; ++step) {
      auto [x, y] = batch(step);
      mine.push_back(runtime.step(x, y));
      buffers.push_back(runtime.stats().buffers_allocated);
    }
    std::lock_guard lock(mu);
    losses[static_cast<size_t>(rank)] = mine;
    run.peak_in_flight[static_cast<size_t>(rank)] = runtime.stats().peak_in_flight_rank;
    run.peak_in_flight_stage0[static_cast<size_t>(rank)] = runtime.stats().peak_in_flight[0];
    run.recvs_posted_early += runtime.stats().recvs_posted_early;
    if (rank == p - 1) run.buffers_after_step = buffers;
  });
  run.losses = losses[0];
  for (const auto& l : losses) run.ranks_agree = run.ranks_agree && l == losses[0];
  return run;
}

struct Case {
  std::string name;
  int p;
  std::string schedule;
  int v;
  std::string layout;  // empty: uniform
};

class PipelineParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineParityTest, LossesMatchOneProcessFor20Steps) {
  const Case& c = GetParam();
  const int m = 4;
  const PipelineSchedule schedule = make_schedule(c.schedule, c.p, m, c.v);
  const int S = schedule.num_stages;
  const int blocks = static_cast<int>(tiny_config().n_layer);
  const std::vector<int> layout =
      c.layout.empty() ? uniform_layout(blocks, S) : parse_layout(c.layout, blocks, S);
  const PipelineRun run = train(schedule, layout);
  const auto& ref = reference_losses();
  ASSERT_EQ(run.losses.size(), ref.size());
  EXPECT_TRUE(run.ranks_agree) << "every rank returns the last stage's loss";
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(run.losses[i], ref[i], kTolerance * std::abs(ref[i])) << "step " << i;
  }
  EXPECT_LT(ref.back(), ref.front() * 0.9) << "the reference run learns";
  // The activations each rank held at once are the schedule's.
  const ScheduleCheck check = validate_schedule(schedule);
  EXPECT_EQ(run.peak_in_flight, check.peak_in_flight);
  if (c.p > 1) {
    EXPECT_GT(run.recvs_posted_early, 0) << "receives are posted ahead from the second step";
    // Receive buffers are made in the first step and reused afterwards.
    EXPECT_EQ(run.buffers_after_step.back(), run.buffers_after_step[1]);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PipelineParityTest,
    ::testing::Values(Case{"pp1_interleaved_v2", 1, "interleaved-1f1b", 2, ""},
                      Case{"pp2_gpipe", 2, "gpipe", 1, ""},
                      Case{"pp2_1f1b_uneven", 2, "1f1b", 1, "4,2"},
                      Case{"pp2_interleaved_v2", 2, "interleaved-1f1b", 2, ""},
                      Case{"pp2_zero_bubble", 2, "zero-bubble", 1, ""},
                      Case{"pp4_gpipe", 4, "gpipe", 1, ""}, Case{"pp4_1f1b", 4, "1f1b", 1, ""},
                      Case{"pp4_interleaved_v2_empty_stages", 4, "interleaved-1f1b", 2, ""},
                      Case{"pp4_zero_bubble_uneven", 4, "zero-bubble", 1, "1,3,0,2"}),
    [](const auto& info) { return info.param.name; });

// Trains the tiny GPT on a (pp, dp_shard, tp) mesh of rank threads: the pipeline over pp, each
// stage split by gpt_stage_tp_plan over tp (tp > 1; the logits split by vocabulary into
// loss_parallel_cross_entropy) and fully_shard'ed over dp_shard (dp > 1), each dp rank on its
// rows of the batch. Checks that the mean over ranks of each step's loss (the mean of the dp
// rows' losses) is the one-process loss, and returns the FSDP stats of each rank's first stage.
std::vector<FSDPStats> expect_mesh_parity(int pp, int dp, int tp, const PipelineSchedule& schedule,
                                          const std::vector<int>& layout, int steps,
                                          bool gather_once = true) {
  const int world = pp * dp * tp;
  std::vector<std::vector<double>> losses(static_cast<size_t>(world));
  std::vector<FSDPStats> fsdp_stats(static_cast<size_t>(world));
  std::mutex mu;
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    DeviceMesh mesh =
        init_device_mesh(pg.shared_from_this(), {pp, dp, tp}, {"pp", "dp_shard", "tp"});
    const int stage_rank = static_cast<int>(mesh.local_rank("pp"));
    const int dp_rank = static_cast<int>(mesh.local_rank("dp_shard"));
    auto stages = make_gpt_stages(tiny_config(), layout, stage_rank, pp);
    for (auto& s : stages) {
      if (tp > 1) parallelize_module(*s, mesh["tp"], gpt_stage_tp_plan(*s));
      if (dp > 1) fully_shard(*s, mesh["dp_shard"]);
    }
    PipelineLoss loss = nn::GPT::loss;
    if (tp > 1) {
      loss = [tp_mesh = mesh["tp"]](const Tensor& logits, const Tensor& y) {
        return loss_parallel_cross_entropy(logits, y, tp_mesh, tiny_config().vocab_size);
      };
    }
    Trainer trainer(mesh.group("pp"), schedule, local_stages(stages), loss, gpt_tied_parameters(),
                    gather_once);
    std::vector<double> mine;
    const int64_t rows = kBatch / dp;
    for (int step = 0; step < steps; ++step) {
      auto [x, y] = batch(step);
      mine.push_back(trainer.runtime().step(contiguous(narrow(x, 0, dp_rank * rows, rows)),
                                            contiguous(narrow(y, 0, dp_rank * rows, rows))));
    }
    std::lock_guard lock(mu);
    losses[static_cast<size_t>(pg.rank())] = mine;
    if (dp > 1) fsdp_stats[static_cast<size_t>(pg.rank())] = fsdp_module(*stages[0])->stats();
  });
  const auto& ref = reference_losses();
  for (int step = 0; step < steps; ++step) {
    double sum = 0;
    for (const auto& l : losses) sum += l[static_cast<size_t>(step)];
    const double mean = sum / world;
    EXPECT_NEAR(mean, ref[static_cast<size_t>(step)], kTolerance * std::abs(ref[step])) << step;
  }
  return fsdp_stats;
}

// (pp, dp_shard) = (2, 2): parameters gathered once per step per stage (or per micro-batch by
// option), gradients reduce-scattered once per step.
void expect_fsdp_parity(bool gather_once, int steps) {
  const auto stats =
      expect_mesh_parity(2, 2, 1, make_1f1b(2, 2), uniform_layout(6, 2), steps, gather_once);
  for (const FSDPStats& st : stats) {
    EXPECT_EQ(st.reduce_scatters, steps) << "one reduce_scatter per stage and step";
    if (gather_once) {
      EXPECT_EQ(st.all_gathers, steps) << "one all_gather per stage and step";
    } else {
      EXPECT_GT(st.all_gathers, steps);
    }
  }
}

TEST(PipelineFsdpTest, Pp2DpShard2MatchesOneProcessGatheringOncePerStep) {
  expect_fsdp_parity(/*gather_once=*/true, kSteps);
}

TEST(PipelineFsdpTest, GatheringPerMicroBatchAlsoMatches) {
  expect_fsdp_parity(/*gather_once=*/false, 5);
}

// Zero-bubble over FSDP stages: B runs the whole backward there (the reduce-scatter wants each
// gradient complete within one pass), still one reduce_scatter per stage and step.
TEST(PipelineFsdpTest, ZeroBubbleKeepsTheWholeBackwardInB) {
  const int steps = 5;
  const auto stats = expect_mesh_parity(2, 2, 1, make_schedule("zero-bubble", 2, 4, 1),
                                        uniform_layout(6, 2), steps);
  for (const FSDPStats& st : stats) EXPECT_EQ(st.reduce_scatters, steps);
}

// (pp, tp) = (2, 2), uneven stages.
TEST(PipelineTpTest, Pp2Tp2MatchesOneProcess) {
  expect_mesh_parity(2, 1, 2, make_1f1b(2, 4), {2, 4}, kSteps);
  EXPECT_THROW(
      gpt_stage_tp_plan(*make_gpt_stages(tiny_config(), {6}, 0, 1)[0], {.sequence_parallel = true}),
      InvalidArgument);
}

// (pp, tp) = (2, 2) with zero-bubble: B defers the column- and row-parallel linears' weight
// gradients (their pieces are leaves) while the input gradients' all-reduces stay in B.
TEST(PipelineTpTest, ZeroBubbleMatchesOneProcess) {
  expect_mesh_parity(2, 1, 2, make_schedule("zero-bubble", 2, 4, 1), {3, 3}, 5);
}

// (pp, dp_shard, tp) = (2, 2, 2) on 8 rank threads, interleaved: 10 steps.
TEST(PipelineTpTest, ThreeDimensionalMatchesOneProcess) {
  expect_mesh_parity(2, 2, 2, make_interleaved_1f1b(2, 2, 2), {1, 2, 2, 1}, 10);
}

// The Llama's stages: 3 layers over 2 ranks, untied with 1F1B and tied (the LM head on the last
// stage, the embedding on stage 0, summed at STEP) with interleaved 1F1B over 4 stages, one of
// them empty; 10 steps against one process.
void expect_llama_parity(bool tied, const std::string& schedule_name, int v) {
  nn::LlamaConfig cfg = nn::LlamaConfig::tiny();
  cfg.n_layers = 3;
  cfg.tie_word_embeddings = tied;
  cfg.seed = 3;
  constexpr int kLlamaSteps = 10;
  std::vector<double> ref;
  {
    nn::Llama model(cfg);
    nn::optim::AdamW opt(model.parameters(), adamw_options());
    for (int step = 0; step < kLlamaSteps; ++step) {
      auto [x, y] = batch(step);
      model.zero_grad();
      Tensor loss = nn::Llama::loss(model(x), y);
      tessel::backward(loss);
      nn::optim::clip_grad_norm(model.parameters(), kMaxNorm);
      opt.step();
      ref.push_back(item(loss));
    }
  }
  const int p = 2;
  const PipelineSchedule schedule = make_schedule(schedule_name, p, 4, v);
  const std::vector<int> layout = uniform_layout(3, schedule.num_stages);
  std::vector<double> losses;
  std::mutex mu;
  threads::run_ranks(p, [&](ProcessGroup& pg) {
    Trainer trainer(pg.shared_from_this(), schedule,
                    local_stages(make_llama_stages(cfg, layout, pg.rank(), p)), nn::Llama::loss,
                    llama_tied_parameters(cfg));
    PipelineRuntime& runtime = trainer.runtime();
    std::vector<double> mine;
    for (int step = 0; step < kLlamaSteps; ++step) {
      auto [x, y] = batch(step);
      mine.push_back(runtime.step(x, y));
    }
    std::lock_guard lock(mu);
    if (pg.rank() == 0) losses = mine;
  });
  ASSERT_EQ(losses.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(losses[i], ref[i], kTolerance * std::abs(ref[i])) << "step " << i;
  }
}

TEST(PipelineLlamaTest, UntiedOneFOneBMatchesOneProcess) { expect_llama_parity(false, "1f1b", 1); }

TEST(PipelineLlamaTest, TiedInterleavedMatchesOneProcess) {
  expect_llama_parity(true, "interleaved-1f1b", 2);
}

// Zero-bubble: B defers the Llama's projections and its tied LM head to W.
TEST(PipelineLlamaTest, TiedZeroBubbleMatchesOneProcess) {
  expect_llama_parity(true, "zero-bubble", 1);
}

TEST(PipelineLlamaTest, MixtureOfExpertsIsRefused) {
  EXPECT_THROW(make_llama_stages(nn::LlamaConfig::tiny_moe(), {1, 1}, 0, 2), InvalidArgument);
}

// 1F1B holds at most p micro-batches on stage 0, however many micro-batches run; GPipe all m.
TEST(PipelineMemoryTest, OneFOneBHoldsAtMostPOnStageZero) {
  const int p = 4;
  const int m = 8;
  const std::vector<int> layout = uniform_layout(6, p);
  const PipelineRun one_f_one_b = train(make_1f1b(p, m), layout, 1);
  EXPECT_EQ(one_f_one_b.peak_in_flight_stage0[0], p);
  for (int r = 0; r < p; ++r) EXPECT_EQ(one_f_one_b.peak_in_flight[static_cast<size_t>(r)], p - r);
  const PipelineRun gpipe = train(make_gpipe(p, m), layout, 1);
  EXPECT_EQ(gpipe.peak_in_flight_stage0[0], m);
}

// Zero-bubble's split backward is real: on every rank, B leaves the linear layers' weight and
// bias gradients untouched (queued: one per linear layer and micro-batch, the LM head's
// included) and W adds them; the step's gradients equal, bit for bit, those of the same schedule
// run with defer_weight_gradients = false (B the whole backward), which runs the same ops.
TEST(PipelineZeroBubbleTest, BLeavesLinearWeightGradientsToW) {
  const int p = 2, m = 4;
  const PipelineSchedule schedule = make_schedule("zero-bubble", p, m, 1);
  const std::vector<int> layout = uniform_layout(static_cast<int>(tiny_config().n_layer), p);
  using Grads = std::vector<std::vector<float>>;
  auto grads_of = [](const std::vector<Tensor>& params) {
    Grads out;
    for (const Tensor& t : params) {
      out.push_back(t.grad().defined() ? to_vector<float>(t.grad()) : std::vector<float>{});
    }
    return out;
  };
  std::vector<Grads> at_step[2];  // [split][rank]: every parameter's gradient at STEP
  for (int split = 0; split < 2; ++split) {
    at_step[split].assign(static_cast<size_t>(p), {});
    threads::run_ranks(p, [&](ProcessGroup& pg) {
      const int rank = pg.rank();
      auto stages = make_gpt_stages(tiny_config(), layout, rank, p);
      std::vector<Tensor> linear;  // c_attn, c_proj, c_fc weights and biases
      for (auto& [name, t] : stages[0]->named_parameters()) {
        if (name.find(".c_") != std::string::npos) linear.push_back(t);
      }
      ASSERT_EQ(linear.size(), 3u * 4 * 2) << "3 blocks of 4 linear layers with biases";
      Grads before;
      const Action* previous = nullptr;
      int b_checked = 0, w_checked = 0;
      PipelineRuntime rt(
          pg.shared_from_this(), schedule, local_stages(stages), nn::GPT::loss,
          {.on_step =
               [&] { at_step[split][static_cast<size_t>(rank)] = grads_of(rt.parameters()); },
           .tied_parameters = gpt_tied_parameters(),
           .defer_weight_gradients = split == 1,
           .before_action =
               [&](const Action& a) {
                 Grads now = grads_of(linear);
                 if (split == 1 && previous != nullptr &&
                     previous->kind == ActionKind::kBackwardInput) {
                   EXPECT_EQ(now, before)
                       << "B of mb " << previous->microbatch << " on rank " << rank;
                   ++b_checked;
                 }
                 if (split == 1 && previous != nullptr &&
                     previous->kind == ActionKind::kBackwardWeight) {
                   EXPECT_NE(now, before)
                       << "W of mb " << previous->microbatch << " on rank " << rank;
                   ++w_checked;
                 }
                 before = std::move(now);
                 previous = &a;
                 return true;
               }});
      auto [x, y] = batch(0);
      rt.step(x, y);
      const int64_t linears = 4 * 3 + (rank == p - 1 ? 1 : 0);  // the LM head on the last stage
      EXPECT_EQ(rt.stats().weight_grads_deferred, split == 1 ? m * linears : 0);
      if (split == 1) {
        EXPECT_EQ(b_checked, m);
        EXPECT_EQ(w_checked, m);
      }
    });
  }
  for (int r = 0; r < p; ++r) {
    const Grads& plain = at_step[0][static_cast<size_t>(r)];
    ASSERT_FALSE(plain.empty());
    EXPECT_EQ(at_step[1][static_cast<size_t>(r)], plain) << "rank " << r;
  }
}

// Every send and receive is flight-recorded with the pipeline action it serves, so tessel-trace
// names the stage, micro-batch and action of a hang (tests/flight_recorder/pipeline_hang_test).
TEST(PipelineRuntimeRecordTest, SendsAndReceivesCarryTheirAction) {
  train(make_1f1b(2, 2), uniform_layout(6, 2), 1);
  int sends = 0, recvs = 0;
  for (const fr::Entry& e : fr::FlightRecorder::global().snapshot()) {
    const std::string text = e.text;
    if (e.op == fr::OpType::kSend && text == "pipeline SEND_F1s0>1: mb 1, stage 0") ++sends;
    if (e.op == fr::OpType::kRecv && text == "pipeline RECV_B1s0<1: mb 1, stage 0") ++recvs;
  }
  EXPECT_GE(sends, 1);
  EXPECT_GE(recvs, 1);
}

// Every rank throws the same error, naming the action, before anything is sent.
std::vector<std::string> errors_on_every_rank(int p,
                                              const std::function<PipelineSchedule(int)>& make) {
  std::vector<std::string> errors(static_cast<size_t>(p));
  std::mutex mu;
  threads::run_ranks(p, [&](ProcessGroup& pg) {
    const auto local =
        local_stages(make_gpt_stages(tiny_config(), uniform_layout(6, p), pg.rank(), p));
    try {
      PipelineRuntime runtime(pg.shared_from_this(), make(pg.rank()), local, nn::GPT::loss);
    } catch (const InvalidArgument& e) {
      std::lock_guard lock(mu);
      errors[static_cast<size_t>(pg.rank())] = e.what();
    }
  });
  return errors;
}

TEST(PipelineRuntimeErrorTest, MalformedScheduleFailsOnEveryRankNamingTheAction) {
  const auto errors = errors_on_every_rank(2, [](int) {
    PipelineSchedule s = make_1f1b(2, 2);
    // Rank 0 never sends micro-batch 1's activation.
    auto& actions = s.ranks[0];
    actions.erase(
        std::find(actions.begin(), actions.end(), Action{ActionKind::kSendActivation, 1, 0, 1}));
    return s;
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("RECV_F1s1<0"), std::string::npos) << e;
    EXPECT_EQ(e, errors[0]);
  }
}

TEST(PipelineRuntimeErrorTest, RanksRunningDifferentSchedulesFailOnEveryRank) {
  const auto errors = errors_on_every_rank(
      2, [](int rank) { return rank == 0 ? make_1f1b(2, 4) : make_gpipe(2, 4); });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("ranks 1 run a schedule that differs from rank 0's"), std::string::npos) << e;
  }
}

TEST(PipelineRuntimeErrorTest, StagesNotTheSchedulesFail) {
  threads::run_ranks(1, [&](ProcessGroup& pg) {
    auto stages = make_gpt_stages(tiny_config(), uniform_layout(6, 2), 0, 1);
    std::vector<LocalStage> local{{stages[0]->stage(), stages[0]}};  // stage 1 missing
    try {
      PipelineRuntime runtime(pg.shared_from_this(), make_interleaved_1f1b(1, 2, 2), local,
                              nn::GPT::loss);
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("given stages [0]"), std::string::npos) << e.what();
    }
  });
}

// Given the batch, every rank fails (a middle stage too), naming the shape, before any send.
TEST(PipelineRuntimeErrorTest, BatchNotDivisibleByMicroBatchesFailsOnEveryRank) {
  std::vector<std::string> errors(3);
  std::mutex mu;
  threads::run_ranks(3, [&](ProcessGroup& pg) {
    PipelineRuntime runtime(pg.shared_from_this(), make_gpipe(3, 3),
                            local_stages(make_gpt_stages(tiny_config(), {2, 2, 2}, pg.rank(), 3)),
                            nn::GPT::loss);
    auto [x, y] = batch(0);  // 8 rows for 3 micro-batches
    try {
      runtime.step(x, y);
    } catch (const InvalidArgument& e) {
      std::lock_guard lock(mu);
      errors[static_cast<size_t>(pg.rank())] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("the inputs (8, 8) have 8 rows, which the schedule's 3 micro-batches do not "
                     "divide"),
              std::string::npos)
        << e;
  }
}

// Stages hold only their own layers, with the whole model's names and initial values.
TEST(GptStageTest, StagesHoldOnlyTheirLayersWithTheWholeModelsValues) {
  const nn::GptConfig cfg = tiny_config();
  nn::GPT whole(cfg);
  const auto expected = whole.state_dict();
  const std::vector<int> layout = {1, 2, 2, 1};
  std::set<std::string> seen;
  for (int rank = 0; rank < 2; ++rank) {
    auto stages = make_gpt_stages(cfg, layout, rank, 2);
    ASSERT_EQ(stages.size(), 2u);
    for (const auto& stage : stages) {
      EXPECT_EQ(stage->stage() % 2, rank);
      for (const auto& [name, t] : stage->named_parameters()) {
        ASSERT_FALSE(t.is_meta()) << name;
        ASSERT_TRUE(expected.count(name)) << name;
        EXPECT_EQ(to_vector<float>(t), to_vector<float>(expected.at(name))) << name;
        seen.insert(name);
      }
    }
    // Stage 1 on rank 1 holds blocks 1 and 2 only.
    if (rank == 1) {
      std::vector<std::string> names;
      for (const auto& [name, t] : stages[0]->named_parameters()) names.push_back(name);
      EXPECT_TRUE(std::all_of(names.begin(), names.end(), [](const std::string& n) {
        return n.rfind("transformer.h.1.", 0) == 0 || n.rfind("transformer.h.2.", 0) == 0;
      }));
    }
  }
  EXPECT_EQ(seen.size(), expected.size()) << "the stages together hold the whole model";
}

TEST(GptStageTest, ChainedStagesComputeTheWholeModel) {
  const nn::GptConfig cfg = tiny_config();
  nn::GPT whole(cfg);
  auto stages = make_gpt_stages(cfg, {2, 0, 3, 1}, 0, 1);
  auto [x, y] = batch(3);
  Tensor h = x;
  for (auto& s : stages) h = (*s)(h);
  EXPECT_EQ(to_vector<float>(h), to_vector<float>(whole(x)));
}

TEST(StageLayoutTest, UniformParsedAndBalanced) {
  EXPECT_EQ(uniform_layout(6, 4), (std::vector<int>{2, 2, 1, 1}));
  EXPECT_EQ(uniform_layout(2, 4), (std::vector<int>{1, 1, 0, 0}));
  EXPECT_EQ(parse_layout("1,3,0,2", 6, 4), (std::vector<int>{1, 3, 0, 2}));
  EXPECT_THROW(parse_layout("1,3,2", 6, 4), InvalidArgument);
  EXPECT_THROW(parse_layout("1,x,3,2", 6, 4), InvalidArgument);
  EXPECT_THROW(parse_layout("1,4,0,2", 6, 4), InvalidArgument);
  // A head worth 3 blocks takes a stage to itself; an embedding worth 2 leaves stage 0 one block.
  EXPECT_EQ(balanced_layout(std::vector<double>{0, 1, 1, 1, 1, 1, 1, 3}, 3),
            (std::vector<int>{3, 3, 0}));
  EXPECT_EQ(balanced_layout(std::vector<double>{2, 1, 1, 1, 1, 0}, 2), (std::vector<int>{1, 3}));
  // Even costs spread evenly.
  const std::vector<double> even = {0, 1, 1, 1, 1, 0};
  EXPECT_EQ(balanced_layout(even, 2), (std::vector<int>{2, 2}));
  const auto gpt = gpt_layer_costs(tiny_config(), kSeq);
  EXPECT_EQ(gpt.size(), 8u);
  EXPECT_EQ(format_layout(balanced_layout(gpt, 2)).size(), 3u);
  EXPECT_THROW(balanced_layout(std::vector<double>{1, -1, 1}, 2), InvalidArgument);
}

}  // namespace
}  // namespace tessel::pp
