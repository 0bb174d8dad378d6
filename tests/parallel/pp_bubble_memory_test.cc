// The pipeline runtime's bubble and activation memory, measured on the running runtime (rank
// threads), not on the schedule simulator:
// - bubble: every compute action is given a fixed modeled cost (F, B, W; a full backward costs
//   B + W; an interleaved stage 1/v of each) and every transfer the fake backend's link model
//   (latency + bytes / bandwidth, pp::link_time). Each rank keeps a modeled clock that its
//   stages' forward and backward advance; the time a tensor arrives travels inside the tensor the
//   runtime sends (its first element), so a rank waits in modeled time exactly when the runtime
//   made it wait for a peer. Each rank's idle fraction (1 − busy / makespan) is within 0.02 of
//   theory — (p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m+p−1) for interleaved 1F1B, and
//   (p−1)(F+B−W) / (m(F+B+W) + (p−1)(F+B−W)) for zero-bubble ZB-H1 — and equal to
//   simulate_schedule's for the same costs; zero-bubble idles less than 1F1B on every rank.
//   (The transport is the threads backend: the fake backend moves no data and does not order
//   ranks, so it cannot carry the arrival times; its link model is what the transfers cost.)
// - memory: stage 0 saves a 1 MiB activation per micro-batch for its backward (the other stages
//   save nothing), so the process-wide CPU allocator's peak over a step, less what was allocated
//   before it, is stage 0's activations plus a few KiB of the ranks' small tensors: 1F1B's is
//   p activations (p micro-batches in flight), GPipe's m, each within a quarter of an
//   activation.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/pp/runtime.h"
#include "tessel/parallel/pp/schedule_generate.h"
#include "tessel/parallel/pp/schedule_simulate.h"
#include "tessel/parallel/pp/schedule_validate.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"

namespace tessel::pp {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kRows = 2;    // rows per micro-batch
constexpr int64_t kWidth = 16;  // what crosses a stage boundary: kRows x kWidth f32 (128 B)

// Modeled costs of one whole rank's layers (an interleaved stage costs 1/v of them) and the fake
// backend's link model. Arrival times travel as f32 nanoseconds, exact below 2^24 ns (16.7 ms):
// the longest step here (GPipe, p = 4, m = 8) is under 4 ms.
constexpr Nanoseconds kForward = 120us, kBackwardInput = 120us, kBackwardWeight = 120us;
constexpr Nanoseconds kLatency = 2us;
constexpr double kBytesPerSecond = 1e9;

// One rank's modeled time. Used only by that rank's thread (the runtime runs a rank's actions,
// and so its stages' forward and backward, on the thread that calls step()).
struct RankClock {
  Nanoseconds now{0};
  Nanoseconds busy{0};
  std::vector<Nanoseconds> link_free;  // per receiving rank: when its link is free again
  Action current;                      // the action the runtime is running
  int v = 1;                           // virtual stages per rank: each costs 1/v

  void reset(int p) {
    now = busy = Nanoseconds{0};
    link_free.assign(static_cast<size_t>(p), Nanoseconds{0});
  }
  // Runs a compute action of `cost` (a whole rank's) that may start once `ready`.
  void compute(Nanoseconds ready, Nanoseconds cost) {
    now = std::max(now, ready) + cost / v;
    busy += cost / v;
  }
  // When a tensor of `bytes` sent to `dst` now arrives, transfers on one link one at a time
  // (the fake backend's model: a group is one link); a stage on this rank gets it at once.
  Nanoseconds arrival(int self, int dst, int64_t bytes) {
    if (dst == self) return now;
    Nanoseconds& free = link_free[static_cast<size_t>(dst)];
    free = std::max(now, free) + link_time(kLatency, bytes, kBytesPerSecond);
    return free;
  }
};

float stamp(Nanoseconds t) {
  TESSEL_CHECK(t < Nanoseconds(1 << 24), Internal, "modeled time {} ns is not exact in f32",
               t.count());
  return static_cast<float>(t.count());
}
Nanoseconds read_stamp(const Tensor& t) {
  return Nanoseconds(static_cast<int64_t>(contiguous(t).data<float>()[0]));
}

// A pipeline stage with no real compute: forward and backward advance the rank's modeled clock
// by their fixed cost, after the input (or the output's gradient) has arrived in modeled time,
// and stamp what they produce with the time it reaches the rank that consumes it. Optionally
// saves `saved_floats` f32 for backward: the micro-batch's activations.
class ModeledStage : public nn::Module {
 public:
  ModeledStage(int stage, const PipelineSchedule& schedule, int rank, RankClock* clock,
               int64_t saved_floats)
      : Module("ModeledStage"),
        stage_(stage),
        last_(schedule.num_stages - 1),
        rank_(rank),
        prev_rank_(stage > 0 ? schedule.stage_rank(stage - 1) : -1),
        next_rank_(stage < last_ ? schedule.stage_rank(stage + 1) : -1),
        clock_(clock),
        saved_floats_(saved_floats) {
    // A weight, so that stage 0 (whose input needs no gradient) records a backward too.
    weight_ = &register_parameter("weight" + std::to_string(stage), ones({1}));
  }

  Tensor forward(const Tensor& x) override {
    return apply_function(
        "modeled_stage", {x, *weight_},
        [this](FunctionContext& ctx, const std::vector<Tensor>& in) {
          Tensor out = full({kRows, kWidth}, 0.0);
          if (clock_ != nullptr) {
            clock_->compute(stage_ > 0 ? read_stamp(in[0]) : Nanoseconds{0}, kForward);
            if (stage_ < last_) {
              out.data<float>()[0] = stamp(clock_->arrival(rank_, next_rank_, out.nbytes()));
            }
          }
          if (saved_floats_ > 0) ctx.save_for_backward({empty({saved_floats_})});
          return std::vector<Tensor>{out};
        },
        [this](FunctionContext& ctx, const std::vector<Tensor>& grad) {
          Tensor gx;
          if (ctx.needs_input_grad(0)) gx = full({kRows, kWidth}, 0.0);
          if (clock_ != nullptr) {
            const ActionKind kind = clock_->current.kind;
            TESSEL_CHECK(kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput,
                         Internal, "stage {}: backward ran in {}", stage_,
                         to_string(clock_->current));
            // A full backward does W's work too; a split one leaves it to W.
            const Nanoseconds cost =
                kBackwardInput + (kind == ActionKind::kBackward ? kBackwardWeight : 0ns);
            clock_->compute(stage_ < last_ ? read_stamp(grad[0]) : Nanoseconds{0}, cost);
            if (gx.defined()) {
              gx.data<float>()[0] = stamp(clock_->arrival(rank_, prev_rank_, gx.nbytes()));
            }
          }
          return std::vector<Tensor>{gx, full({1}, 0.0)};
        })[0];
  }

 private:
  int stage_, last_, rank_, prev_rank_, next_rank_;
  RankClock* clock_;
  int64_t saved_floats_;
  Tensor* weight_;
};

Tensor modeled_loss(const Tensor& output, const Tensor&) { return mean(output); }

struct Measured {
  std::vector<double> idle_fraction;  // per rank, of the last step
  std::vector<Nanoseconds> busy;
  Nanoseconds makespan{0};
  std::vector<int> peak_in_flight_stage0;  // runtime's count, per rank (its first stage)
  int64_t stage0_peak_bytes = 0;           // allocator peak over the last step, less before it
};

// Runs `steps` steps of `schedule` on rank threads; stage 0 saves `saved_floats` per
// micro-batch. Clocks restart at each step; the figures are the last step's.
Measured run(const PipelineSchedule& schedule, int steps, int64_t saved_floats, bool timed) {
  const int p = schedule.num_ranks;
  const int m = schedule.num_microbatches;
  std::vector<RankClock> clocks(static_cast<size_t>(p));
  Measured out;
  out.idle_fraction.assign(static_cast<size_t>(p), 0);
  out.busy.assign(static_cast<size_t>(p), Nanoseconds{0});
  out.peak_in_flight_stage0.assign(static_cast<size_t>(p), 0);
  std::mutex mu;
  threads::run_ranks(p, [&](ProcessGroup& pg) {
    const int rank = pg.rank();
    RankClock& clock = clocks[static_cast<size_t>(rank)];
    clock.v = schedule.virtual_stages();
    std::vector<LocalStage> local;
    for (int s = rank; s < schedule.num_stages; s += p) {
      local.push_back(
          {s, std::make_shared<ModeledStage>(s, schedule, rank, timed ? &clock : nullptr,
                                             s == 0 ? saved_floats : 0)});
    }
    PipelineOptions options;
    options.before_action = [&clock](const Action& a) {
      clock.current = a;
      // W has no module call here (B did the whole backward): its cost is charged as it runs.
      if (a.kind == ActionKind::kBackwardWeight) clock.compute(Nanoseconds{0}, kBackwardWeight);
      return true;
    };
    PipelineRuntime runtime(pg.shared_from_this(), schedule, local, modeled_loss, options);
    const Tensor batch = full({kRows * m, kWidth}, 0.0);
    int64_t before = 0;
    for (int step = 0; step < steps; ++step) {
      clock.reset(p);
      if (step == steps - 1) {
        // All ranks between steps: nothing of the last step's is held any more.
        pg.barrier();
        if (rank == 0) {
          reset_peak_memory_stats(Device::cpu());
          before = memory_stats(Device::cpu()).allocated_bytes;
        }
        pg.barrier();
      }
      runtime.step(batch, batch);
    }
    pg.barrier();
    std::lock_guard lock(mu);
    if (rank == 0)
      out.stage0_peak_bytes = memory_stats(Device::cpu()).peak_allocated_bytes - before;
    out.peak_in_flight_stage0[static_cast<size_t>(rank)] = runtime.stats().peak_in_flight[0];
  });
  for (const RankClock& c : clocks) out.makespan = std::max(out.makespan, c.now);
  for (int r = 0; r < p; ++r) {
    out.busy[static_cast<size_t>(r)] = clocks[static_cast<size_t>(r)].busy;
    out.idle_fraction[static_cast<size_t>(r)] =
        1.0 - static_cast<double>(clocks[static_cast<size_t>(r)].busy.count()) /
                  static_cast<double>(out.makespan.count());
  }
  return out;
}

// Theory, with F, B and W costing kForward, kBackwardInput, kBackwardWeight and free links.
double theory(const std::string& name, int p, int m, int v) {
  const double F = static_cast<double>(kForward.count());
  const double B = static_cast<double>(kBackwardInput.count());
  const double W = static_cast<double>(kBackwardWeight.count());
  if (name == "interleaved-1f1b") return (p - 1.0) / (v * m + p - 1.0);
  if (name == "zero-bubble")
    return (p - 1) * (F + B - W) / (m * (F + B + W) + (p - 1) * (F + B - W));
  return (p - 1.0) / (m + p - 1.0);  // gpipe, 1f1b
}

// Absolute, on each rank's idle fraction: the links (about 2.1 us against a 120 us action, or a
// 60 us interleaved stage) lengthen the step a little past free-link theory.
constexpr double kBubbleMargin = 0.02;

TEST(PipelineModeledBubbleTest, MeasuredIdleMatchesTheoryAndTheModel) {
  const ScheduleCosts costs{.forward = kForward,
                            .backward_input = kBackwardInput,
                            .backward_weight = kBackwardWeight,
                            .link = link_time(kLatency, kRows * kWidth * 4, kBytesPerSecond)};
  for (int p : {2, 4}) {
    for (int m : {4, 8}) {
      std::vector<double> one_f1b;
      for (const std::string name : {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}) {
        SCOPED_TRACE(name + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const PipelineSchedule s = make_schedule(name, p, m, 2);
        const int v = s.virtual_stages();
        // Two steps: the second has its receives posted ahead; both must idle alike.
        const Measured got = run(s, 2, 0, /*timed=*/true);
        ScheduleCosts per_stage = costs;
        per_stage.forward /= v;
        per_stage.backward_input /= v;
        per_stage.backward_weight /= v;
        const ScheduleTimeline model = simulate_schedule(s, per_stage);
        const double expected = theory(name, p, m, v);
        std::printf("%-16s p=%d m=%d: theory %.3f, measured per rank", name.c_str(), p, m,
                    expected);
        for (double f : got.idle_fraction) std::printf(" %.3f", f);
        std::printf(" (makespan %.0f us)\n",
                    std::chrono::duration<double, std::micro>(got.makespan).count());
        EXPECT_EQ(got.makespan, model.makespan);
        for (int r = 0; r < p; ++r) {
          const double f = got.idle_fraction[static_cast<size_t>(r)];
          EXPECT_EQ(got.busy[static_cast<size_t>(r)], model.busy[static_cast<size_t>(r)])
              << "rank " << r;
          EXPECT_NEAR(f, expected, kBubbleMargin) << "rank " << r;
          if (name == "1f1b") one_f1b.push_back(f);
          if (name == "zero-bubble") {
            EXPECT_LT(f, one_f1b[static_cast<size_t>(r)]) << "rank " << r;
          }
        }
      }
    }
  }
}

// Stage 0's activations over a step, from the allocator: GPipe holds all m micro-batches,
// 1F1B at most p.
TEST(PipelineActivationPeakTest, StageZeroPeakFollowsTheSchedule) {
  constexpr int64_t kSavedFloats = 256 * 1024;  // 1 MiB per micro-batch on stage 0
  // What one micro-batch's forward on stage 0 keeps until its backward, as the allocator counts.
  int64_t activation = 0;
  {
    const PipelineSchedule s = make_1f1b(1, 1);
    ModeledStage stage(0, s, 0, nullptr, kSavedFloats);
    const Tensor x = full({kRows, kWidth}, 0.0);
    const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
    const Tensor y = stage(x);
    activation = memory_stats(Device::cpu()).allocated_bytes - before;
  }
  ASSERT_GE(activation, kSavedFloats * 4);
  constexpr int m = 8;
  for (int p : {2, 4}) {
    for (const std::string name : {"gpipe", "1f1b"}) {
      SCOPED_TRACE(name + " p=" + std::to_string(p));
      const PipelineSchedule s = make_schedule(name, p, m);
      const int in_flight = name == "gpipe" ? m : p;
      ASSERT_EQ(validate_schedule(s).peak_in_flight[0], in_flight);
      // A warm-up step allocates the receive buffers and gradients; the second is measured.
      const Measured got = run(s, 2, kSavedFloats, /*timed=*/false);
      const double held =
          static_cast<double>(got.stage0_peak_bytes) / static_cast<double>(activation);
      std::printf("%-5s p=%d m=%d: stage 0 peak %s = %.2f activations (schedule: %d)\n",
                  name.c_str(), p, m, bytes_str(got.stage0_peak_bytes).c_str(), held, in_flight);
      EXPECT_EQ(got.peak_in_flight_stage0[0], in_flight);
      EXPECT_NEAR(held, in_flight, 0.25);
    }
  }
}

}  // namespace
}  // namespace tessel::pp
