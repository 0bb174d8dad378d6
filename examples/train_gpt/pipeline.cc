#include "pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include "data.h"
#include "layout.h"
#include "model.h"
#include "tessel/base/error.h"
#include "tessel/base/launch_env.h"
#include "tessel/collectives/init.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/schedule.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/fsdp/ddp.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/pp/gpt_stage.h"
#include "tessel/parallel/pp/llama_stage.h"
#include "tessel/parallel/pp/runtime.h"
#include "tessel/parallel/pp/schedule_generate.h"
#include "tessel/parallel/pp/stage_layout.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/parallel/tp/parallelize.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::train_gpt {

void add_pipeline_flags(CLI::App& app, PipelineFlags& p) {
  app.add_option("--pp", p.pp, "pipeline-parallel ranks: the model split into stages over them")
      ->check(CLI::PositiveNumber);
  app.add_option("--pp-schedule", p.schedule, "pipeline schedule")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}));
  app.add_option("--microbatches", p.microbatches,
                 "micro-batches per step with --pp (0: 2 x --pp); --batch must divide by it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--pp-virtual-stages", p.virtual_stages,
                 "stages per pipeline rank (0: 2 for interleaved-1f1b, else 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--pp-layout", p.layout,
                 "blocks per stage: uniform, balanced (by a per-layer cost profile, embedding "
                 "and head included) or counts such as 2,1,1,2");
}

namespace {

int64_t microbatches(const PipelineFlags& p) {
  return p.microbatches > 0 ? p.microbatches : 2 * p.pp;
}
int64_t virtual_stages(const PipelineFlags& p) {
  if (p.virtual_stages > 0) return p.virtual_stages;
  return p.schedule == "interleaved-1f1b" ? 2 : 1;
}

}  // namespace

void check_pipeline_flags(const Flags& f, const PipelineFlags& p) {
  if (p.pp <= 1) return;
  auto unsupported = [&](bool bad, std::string_view flag) {
    TESSEL_CHECK(!bad, InvalidArgument, "--pp {} with {}: not supported yet (docs/training.md)",
                 p.pp, flag);
  };
  unsupported(f.model != "gpt" && f.model != "llama", "--model " + f.model);
  unsupported(f.sequence_parallel, "--sequence-parallel");
  unsupported(f.model == "llama" && f.tp > 1, "--model llama and --tp");
  unsupported(f.model == "llama" && p.layout == "balanced",
              "--model llama and --pp-layout balanced");
  unsupported(!f.init_hf.empty() || !f.export_hf.empty(), "--init-hf / --export-hf");
  unsupported(f.generate, "--generate");
  unsupported(f.grad_accum > 1, "--grad-accum (use --microbatches)");
  unsupported(f.device != "cpu", "--device " + f.device);
  unsupported(f.activation_checkpointing != "none", "--activation-checkpointing");
  const int64_t m = microbatches(p);
  TESSEL_CHECK(f.batch % m == 0, InvalidArgument,
               "--batch {} does not divide into --microbatches {}; use a multiple of it", f.batch,
               m);
  TESSEL_CHECK(p.schedule == "interleaved-1f1b" || p.virtual_stages <= 1, InvalidArgument,
               "--pp-virtual-stages {} needs --pp-schedule interleaved-1f1b", p.virtual_stages);
  const LaunchEnv env = read_launch_env();
  TESSEL_CHECK(env.world_size % (p.pp * f.tp) == 0, InvalidArgument,
               "--pp {} x --tp {} does not divide the {} ranks the launcher started", p.pp, f.tp,
               env.world_size);
  const int64_t dp = env.world_size / (p.pp * f.tp);
  TESSEL_CHECK(!f.ddp || (f.tp == 1 && f.dp_replicate == 1), InvalidArgument,
               "--pp {} --ddp replicates each stage over the other ranks; drop --tp and "
               "--dp-replicate (or use --dp-replicate for HSDP instead of --ddp)",
               p.pp);
  TESSEL_CHECK(dp % f.dp_replicate == 0, InvalidArgument,
               "--dp-replicate {} does not divide the {} data-parallel ranks left by --pp {} x "
               "--tp {} of {}",
               f.dp_replicate, dp, p.pp, f.tp, env.world_size);
  TESSEL_CHECK(f.batch % dp != 0 || f.batch / dp % m == 0, InvalidArgument,
               "--batch {} gives each of the {} data-parallel ranks {} rows, which --microbatches "
               "{} does not divide; use a --batch of a multiple of {}",
               f.batch, dp, f.batch / dp, m, dp * m);
  TESSEL_CHECK(f.dp_shard < 0 || f.ddp || f.dp_shard * f.dp_replicate == dp, InvalidArgument,
               "--dp-shard {}: with --pp {}, --tp {} and --dp-replicate {} of {} ranks, the "
               "stages shard over {}; leave --dp-shard out",
               f.dp_shard, p.pp, f.tp, f.dp_replicate, env.world_size, dp / f.dp_replicate);
  // The schedule and the layout fail here, before any rank starts, when they cannot work.
  const auto schedule = pp::make_schedule(p.schedule, static_cast<int>(p.pp), static_cast<int>(m),
                                          static_cast<int>(virtual_stages(p)));
  const int stages = schedule.num_stages;
  if (p.layout != "uniform" && p.layout != "balanced") {
    pp::parse_layout(p.layout, static_cast<int>(f.layers), stages);
  }
}

int run_pipeline(const Flags& f, const PipelineFlags& p) {
  if (f.threads > 0) set_num_threads(f.threads);
  const int P = static_cast<int>(p.pp);
  const int m = static_cast<int>(microbatches(p));
  std::shared_ptr<ProcessGroup> world = init_process_group({.device = Device::cpu()});
  const int64_t tp = f.tp;
  const int64_t dp = world->size() / (P * tp);
  // Data parallelism inside the stages: FSDP over dp_shard, HSDP over (dp_replicate, dp_shard),
  // or DDP (every dp rank a replica).
  const int64_t replicas = f.ddp ? dp : f.dp_replicate;
  const int64_t shards = dp / replicas;
  DeviceMesh mesh =
      init_device_mesh(world, {P, replicas, shards, tp}, {"pp", "dp_replicate", "dp_shard", "tp"});
  const int stage_rank = static_cast<int>(mesh.local_rank("pp"));
  const int dp_rank =
      static_cast<int>(mesh.local_rank("dp_replicate") * shards + mesh.local_rank("dp_shard"));
  const bool lead = world->rank() == 0;

  // Every rank of a pipeline (and of a tp group) reads its dp column's rows: stage 0 takes the
  // tokens, the last stage the targets.
  TrainingData data(f, dp_rank, dp);
  const ModelSpec spec = model_spec(f, data.vocab_size());
  const nn::GptConfig& cfg = spec.gpt;
  const pp::PipelineSchedule schedule =
      pp::make_schedule(p.schedule, P, m, static_cast<int>(virtual_stages(p)));
  const int S = schedule.num_stages;
  const int L = static_cast<int>(f.layers);
  const std::vector<int> layout = p.layout == "uniform" ? pp::uniform_layout(L, S)
                                  : p.layout == "balanced"
                                      ? pp::balanced_layout(pp::gpt_layer_costs(cfg, f.seq), S)
                                      : pp::parse_layout(p.layout, L, S);
  std::vector<std::shared_ptr<nn::Module>> stages;
  std::vector<int> stage_index;
  if (spec.is_llama) {
    for (auto& s : pp::make_llama_stages(spec.llama, layout, stage_rank, P)) {
      stages.push_back(s);
      stage_index.push_back(s->stage());
    }
  } else {
    for (auto& s : pp::make_gpt_stages(cfg, layout, stage_rank, P)) {
      // Tensor parallelism inside the stage first, then data parallelism.
      if (tp > 1) parallelize_module(*s, mesh["tp"], pp::gpt_stage_tp_plan(*s));
      stages.push_back(s);
      stage_index.push_back(s->stage());
    }
  }
  std::vector<pp::LocalStage> local;
  for (size_t i = 0; i < stages.size(); ++i) {
    pp::LocalStage st{stage_index[i], stages[i]};
    if (f.ddp && dp > 1) {
      const DeviceMesh dp_mesh = mesh.flatten({"dp_replicate", "dp_shard"}, "dp");
      st.ddp = std::make_shared<DDPModule>(replicate(*stages[i], dp_mesh, {.dim = "dp"}));
    } else if (replicas > 1) {
      fully_shard(*stages[i], mesh.slice({"dp_replicate", "dp_shard"}));
    } else if (dp > 1) {
      fully_shard(*stages[i], mesh["dp_shard"]);
    }
    local.push_back(st);
  }

  nn::optim::AdamW* opt = nullptr;
  pp::PipelineRuntime* runtime_ptr = nullptr;
  double norm = 0;
  // With --tp the last stage's logits are split by vocabulary.
  const DeviceMesh tp_mesh = mesh["tp"];
  const int64_t vocab = cfg.vocab_size;
  pp::PipelineLoss loss = lm_loss;
  if (tp > 1) {
    loss = [tp_mesh, vocab](const Tensor& logits, const Tensor& y) {
      return loss_parallel_cross_entropy(logits, y, tp_mesh, vocab);
    };
  }
  pp::PipelineRuntime runtime(
      mesh.group("pp"), schedule, local, loss,
      {.on_step =
           [&] {
             norm = pp::clip_grad_norm(*runtime_ptr, f.clip);
             opt->step();
           },
       .tied_parameters =
           spec.is_llama ? pp::llama_tied_parameters(spec.llama) : pp::gpt_tied_parameters()});
  runtime_ptr = &runtime;
  nn::optim::AdamW adamw(runtime.parameters(),
                         {.lr = f.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = f.weight_decay});
  opt = &adamw;
  nn::optim::WarmupCosine lr({.max_lr = f.lr,
                              .min_lr = f.min_lr,
                              .warmup_steps = std::min(f.warmup, f.steps),
                              .total_steps = f.steps});
  // Checkpoints: each rank its stages' parameters (shards under FSDP / TP) and AdamW state, under
  // the whole model's names, so a run resumes at another --pp, --pp-virtual-stages or dp_shard.
  checkpoint::CheckpointState ckpt_state(world);
  ckpt_state.ranks_hold_different_tensors = true;
  std::unique_ptr<checkpoint::Checkpointer> ckpt;
  int64_t first_step = 0;
  if (!f.checkpoint_dir.empty()) {
    ckpt_state.metadata["model.config"] = model_config_str(f);
    for (auto& s : stages) {
      ckpt_state.add_model("model", *s);
      ckpt_state.add_optimizer("optim", adamw, *s);
    }
    ckpt = std::make_unique<checkpoint::Checkpointer>(
        world, f.checkpoint_dir, checkpoint::CheckpointerOptions{.keep_last = f.keep_checkpoints});
    if (f.resume) {
      if (const auto dir = ckpt->load_latest(ckpt_state)) {
        data.restore(ckpt_state.metadata);
        first_step = ckpt_state.step;
        if (lead) fmt::print("resumed from {} at step {}\n", *dir, first_step);
      } else if (lead) {
        fmt::print("no checkpoint under {}: starting from step 0\n", f.checkpoint_dir);
      }
    }
  }
  if (lead) {
    const std::string data_parallel =
        f.ddp          ? fmt::format("{} ddp", dp)
        : replicas > 1 ? fmt::format("{} dp_replicate x {} dp_shard", replicas, shards)
                       : fmt::format("{} dp_shard", dp);
    fmt::print(
        "train_gpt: pipeline of {} ranks x {} x {} tp, schedule {} ({} stages, {} "
        "micro-batches of {} rows), layout {}; {}{}; data {}\n",
        P, data_parallel, tp, schedule.name, S, m, f.batch / m, pp::format_layout(layout),
        spec.is_llama ? "" : "gpt ", spec.describe(), data.description());
    std::fflush(stdout);
  }
  std::ofstream json;
  if (lead && !f.log_json.empty()) {
    json.open(f.log_json, first_step > 0 ? std::ios::app : std::ios::trunc);
    TESSEL_CHECK(json.good(), IoError, "cannot write --log-json file '{}'", f.log_json);
  }
  using Clock = std::chrono::steady_clock;
  auto window_start = Clock::now();
  double window_loss = 0;
  int64_t window_steps = 0;
  for (int64_t step = first_step; step < f.steps; ++step) {
    fr::FlightRecorder::global().set_step(step);
    const auto [x, y] = data.next_train();
    adamw.set_lr(lr.lr(step));
    const double loss = world_mean(world.get(), runtime.step(x, y));
    window_loss += loss;
    ++window_steps;
    if (json.is_open()) {
      json << fmt::format(
          "{{\"step\": {}, \"loss\": {:.6f}, \"grad_norm\": {:.6f}, \"lr\": {:.6g}}}\n", step + 1,
          loss, norm, adamw.lr());
      json.flush();
    }
    if (lead && ((step + 1) % f.log_every == 0 || step + 1 == f.steps)) {
      const double seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
      fmt::print("step {:>5}/{} loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s\n",
                 step + 1, f.steps, window_loss / window_steps, adamw.lr(), norm,
                 static_cast<double>(f.batch * f.seq * window_steps) / seconds);
      std::fflush(stdout);
      window_loss = 0;
      window_steps = 0;
      window_start = Clock::now();
    }
    if (ckpt && f.checkpoint_every > 0 && (step + 1) % f.checkpoint_every == 0) {
      ckpt_state.step = step + 1;
      data.save(ckpt_state.metadata);
      ckpt->async_save(ckpt_state);  // waits for the previous save first
      if (lead) fmt::print("saving checkpoint step {} in the background\n", step + 1);
    }
  }
  if (ckpt) ckpt->wait();  // rethrows a failed save
  if (lead) {
    const auto& st = runtime.stats();
    fmt::print("train_gpt: done; rank 0 held at most {} micro-batches' activations\n",
               st.peak_in_flight_rank);
  }
  return 0;
}

}  // namespace tessel::train_gpt
