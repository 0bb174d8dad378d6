#include "train.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "cp.h"
#include "data.h"
#include "generate.h"
#include "layout.h"
#include "model.h"
#include "moe.h"
#include "tessel/base/error.h"
#include "tessel/base/launch_env.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/nn/activation_checkpoint.h"
#include "tessel/nn/hf_format.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/schedule.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/fsdp/state_dict.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::train_gpt {
namespace {

using Clock = std::chrono::steady_clock;

double evaluate(nn::Module& model, const BatchStream& next, const Flags& f) {
  NoGradGuard no_grad;
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < f.eval_batches; ++i) {
    auto [x, y] = next();
    total += item(lm_loss(model(nn::Tensors{x})[0], y));  // an MoE's second output: aux loss
  }
  model.train();
  return total / static_cast<double>(f.eval_batches);
}

// "1m05s", "12s", "1h02m".
std::string duration_str(double seconds) {
  const int64_t s = std::llround(std::max(seconds, 0.0));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string progress_bar(int64_t done, int64_t total, int width = 20) {
  const int filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::string bar;
  for (int i = 0; i < width; ++i) bar += i < filled ? "#" : ".";
  return bar;
}

// The validation loss of the model as it trains (every rank: a collective when sharded), on
// the same --eval-batches batches each time: each rank takes its rows of every global batch as
// in training, and the loss is averaged over the world.
double evaluate_during_training(nn::Module& model, int64_t vocab, const TrainingData& data,
                                const Flags& f, const Layout& l, Device device, bool autocast) {
  NoGradGuard no_grad;
  model.eval();
  const BatchStream val = data.validation(l.batch_index, l.batch_parts, f.seed + 2);
  double total = 0;
  for (int64_t i = 0; i < f.eval_batches; ++i) {
    auto [rx, ry] = val();
    std::tie(rx, ry) = cp_slice(rx, ry, f, l);  // --cp: this rank's part of each sequence
    const Tensor x = to(rx, device);
    const Tensor y = to(ry, device);
    std::optional<AutocastGuard> mixed;
    if (autocast) mixed.emplace(DType::kBF16);
    const Tensor logits = model(nn::Tensors{x})[0];
    total += item(l.tp > 1 ? loss_parallel_cross_entropy(logits, y, (*l.mesh)["tp"], vocab)
                           : lm_loss(logits, y));
  }
  model.train();
  // FSDP's root keeps its gathered parameters after forward for the backward that follows one
  // in training; after this forward none comes, so it is freed here.
  if (FSDPModule* root = fsdp_module(model)) root->reshard();
  return world_mean(l.world.get(), total / static_cast<double>(f.eval_batches));
}

// Forward and backward of this rank's rows (x, y) in --grad-accum micro-batches run one after
// another, each loss scaled by 1/N so that the gradients are those of the whole batch. FSDP and
// DDP communicate gradients on the last micro-batch only (set_requires_gradient_sync(false)
// before the others: FSDP keeps unsharded gradients, DDP local ones), or on every one with
// --grad-sync every (FSDP then holds only sharded gradients between micro-batches). Returns the
// rank's loss on its rows.
double accumulate_gradients(nn::Module& model, int64_t vocab, DDPModule* ddp, const Tensor& x,
                            const Tensor& y, const Flags& f, const Layout& l, Device device,
                            bool autocast) {
  FSDPModule* fsdp = fsdp_module(model);
  const int64_t micro_rows = x.size(0) / f.grad_accum;
  double loss_sum = 0;
  for (int64_t m = 0; m < f.grad_accum; ++m) {
    const bool sync = f.grad_sync == "every" || m + 1 == f.grad_accum;
    if (fsdp) fsdp->set_requires_gradient_sync(sync);
    if (ddp) ddp->set_requires_gradient_sync(sync);
    const Tensor xm = to(narrow(x, 0, m * micro_rows, micro_rows), device);
    const Tensor ym = to(narrow(y, 0, m * micro_rows, micro_rows), device);
    Tensor loss;
    {
      std::optional<AutocastGuard> mixed;
      if (autocast) mixed.emplace(DType::kBF16);
      // {logits} ({logits, aux loss} for an MoE); with --tp: this rank's share of the vocabulary
      const nn::Tensors out = model(nn::Tensors{xm});
      const Tensor& logits = out[0];
      loss = l.tp > 1 ? loss_parallel_cross_entropy(logits, ym, (*l.mesh)["tp"], vocab)
                      : lm_loss(logits, ym);
      if (out.size() == 2) loss = add(loss, out[1]);
      if (f.grad_accum > 1) loss = div(loss, static_cast<double>(f.grad_accum));
    }
    backward(loss);
    loss_sum += item(loss);
  }
  return loss_sum;
}

// What the run is: the parallel layout (and, under tensor parallelism, every rank's place in the
// mesh), the data, the model, and where a restarted or resumed run picks up.
void print_setup(const Flags& f, const Layout& layout, const ModelSpec& spec,
                 const TrainingData& data, Device device, bool autocast,
                 const std::string& resumed_from, int64_t first_step) {
  ProcessGroup* world = layout.world.get();
  const int rank = world ? world->rank() : 0;
  const bool lead = rank == 0;
  auto print = [lead]<typename... A>(fmt::format_string<A...> format, A&&... args) {
    if (lead) fmt::print(format, std::forward<A>(args)...);
  };
  if (world) {
    std::string how = f.ddp                  ? "data parallel (DDP)"
                      : layout.replicate > 1 ? "HSDP (FSDP within replicas)"
                      : layout.shard > 1     ? "FSDP"
                                             : "";
    if (layout.cp > 1) {
      how += fmt::format("{}context parallel (cp {})", how.empty() ? "" : " x ", layout.cp);
    }
    if (layout.tp > 1) {
      how += fmt::format("{}tensor parallel{}", how.empty() ? "" : " x ",
                         f.sequence_parallel ? " (sequence parallel)" : "");
    }
    print("{} over {} ranks ({}): mesh {}, {} of {} sequences per {} per step\n", how,
          world->size(), world->backend_name(), layout.mesh->shape_str(),
          f.batch / layout.batch_parts, f.batch, layout.tp > 1 ? "tp group" : "rank");
    if (layout.tp > 1) {  // every rank: where it sits and the groups it talks in
      std::string groups;
      for (const std::string& dim : layout.mesh->dim_names()) {
        groups += fmt::format("{}{} {}", groups.empty() ? "" : ", ", dim,
                              fmt::join((*layout.mesh)[dim].ranks(), "+"));
      }
      fmt::print("rank {} at mesh coordinate ({}): groups {}\n", rank,
                 fmt::join(layout.mesh->coordinate(), ", "), groups);
      std::fflush(stdout);
    }
  }
  print("{}\n", data.description());
  if (!spec.hf_dir.empty()) print("initialised from Hugging Face folder {}\n", spec.hf_dir);
  print("model: {}; global batch {} x {}, {}{}\n", spec.describe(), f.batch, f.seq,
        device.is_cpu() ? fmt::format("{} threads", num_threads()) : device.str(),
        autocast ? ", bf16 autocast" : "");
  // Under tessel-run --max-restarts: which attempt this is, and where it picks up.
  if (const LaunchEnv launch = read_launch_env(); launch.restart_count > 0) {
    print("restarting: attempt {} of {}, {}\n", launch.restart_count + 1,
          launch.max_restarts >= 0 ? fmt::format("{}", launch.max_restarts + 1) : std::string("?"),
          !resumed_from.empty()
              ? fmt::format("resuming from {}",
                            std::filesystem::path(resumed_from).filename().string())
          : f.checkpoint_dir.empty() ? std::string("from step 0 (no --checkpoint-dir)")
          : f.resume                 ? std::string("from step 0 (no committed checkpoint yet)")
                                     : std::string("from step 0 (no --resume)"));
  }
  if (!resumed_from.empty()) {
    print("resumed from {} at step {}\n", resumed_from, first_step);
  } else if (f.resume) {
    print("no checkpoint under {}: starting from step 0\n", f.checkpoint_dir);
  }
}

// Reports the checkpoint being written in the background: its line is printed (on the lead rank)
// once it commits.
class CheckpointProgress {
 public:
  CheckpointProgress(std::string dir, bool lead) : dir_(std::move(dir)), lead_(lead) {}

  // A save of step `step` started: reports the previous one first (it has finished by now).
  void started(Work work, int64_t step) {
    report(true);
    pending_ = Pending{std::move(work), step, Clock::now()};
  }

  // Prints the pending save's line if it has finished, or (`block`) once it finishes.
  void report(bool block) {
    if (!pending_ || (!block && !pending_->work.is_completed())) return;
    try {
      pending_->work.wait();
    } catch (const Error&) {
      // The checkpointer logged the failure; its final wait() rethrows it.
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - pending_->start).count();
    if (lead_ && pending_->work.is_success()) {
      const std::filesystem::path dir =
          std::filesystem::path(dir_) / fmt::format("step_{:08}", pending_->step);
      uint64_t bytes = 0;
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        if (e.is_regular_file(ec)) bytes += e.file_size(ec);
      }
      fmt::print("saved checkpoint {} (step {}, {:.1f} MiB, {:.1f} s)\n", dir.string(),
                 pending_->step, bytes / 1048576.0, seconds);
      std::fflush(stdout);
    }
    pending_.reset();
  }

 private:
  struct Pending {
    Work work;
    int64_t step = 0;
    Clock::time_point start;
  };
  std::string dir_;
  bool lead_;
  std::optional<Pending> pending_;
};

}  // namespace

int run(const Flags& f) {
  const Device device = training_device(f, read_launch_env());
  Layout layout = make_layout(f, device);
  ProcessGroup* world = layout.world.get();
  const int rank = world ? world->rank() : 0;
  const bool lead = rank == 0;
  auto print = [lead]<typename... A>(fmt::format_string<A...> format, A&&... args) {
    if (lead) fmt::print(format, std::forward<A>(args)...);
  };

  if (f.threads > 0) set_num_threads(f.threads);
  TrainingData data(f, layout.batch_index, layout.batch_parts);

  // bf16 autocast (f32 parameters and optimizer state) by default on CUDA, as nanoGPT does: the
  // matmuls run on bf16 tensor cores and attention on the fused kernels (cuDNN on Hopper,
  // flash_cuda otherwise), which take bf16 and f16 only; f32 attention on a GPU runs the slow
  // reference kernel.
  TESSEL_CHECK(f.autocast == "auto" || f.autocast == "bf16" || f.autocast == "off", InvalidArgument,
               "--autocast {}: expected auto, bf16 or off", f.autocast);
  const bool autocast = f.autocast == "bf16" || (f.autocast == "auto" && device.is_cuda());
  const ModelSpec spec = model_spec(f, data.vocab_size());
  std::unique_ptr<DDPModule> ddp;
  std::shared_ptr<ExpertParallel> ep;
  std::unique_ptr<nn::Module> model = build_model(f, spec, layout, &ddp, device, &ep);
  const std::unique_ptr<MoELog> moe_log = MoELog::attach(*model, ep);
  nn::optim::AdamW opt(model->parameters(),
                       {.lr = f.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = f.weight_decay});
  nn::optim::WarmupCosine schedule({.max_lr = f.lr,
                                    .min_lr = f.min_lr,
                                    .warmup_steps = std::min(f.warmup, f.steps),
                                    .total_steps = f.steps});

  // Activation checkpointing inside each block's FSDP/DDP/TP hooks (nn/activation_checkpoint.h).
  nn::checkpoint_blocks(*model, nn::parse_checkpoint_policy(f.activation_checkpointing));

  // Checkpoints: the model (shards under FSDP), AdamW's state and the sampler's position.
  checkpoint::CheckpointState ckpt_state(layout.world);
  std::unique_ptr<checkpoint::Checkpointer> ckpt;
  int64_t first_step = 0;
  std::string resumed_from;
  if (!f.checkpoint_dir.empty()) {
    ckpt_state.metadata["model.config"] = model_config_str(f);  // --generate checks it
    ckpt_state.add_model("model", *model);
    ckpt_state.add_optimizer("optim", opt, *model);
    ckpt = std::make_unique<checkpoint::Checkpointer>(
        layout.world, f.checkpoint_dir,
        checkpoint::CheckpointerOptions{.keep_last = f.keep_checkpoints});
    if (f.resume) {
      if (const auto dir = ckpt->load_latest(ckpt_state)) {
        data.restore(ckpt_state.metadata);
        first_step = ckpt_state.step;
        resumed_from = *dir;
      }
    }
  }
  if (f.generate) {
    return generate_from_checkpoint(f, spec, *model, resumed_from, ckpt_state, lead);
  }
  std::ofstream json;
  if (lead && !f.log_json.empty()) {
    json.open(f.log_json, first_step > 0 ? std::ios::app : std::ios::trunc);
    TESSEL_CHECK(json.good(), IoError, "cannot write --log-json file '{}'", f.log_json);
  }

  print_setup(f, layout, spec, data, device, autocast, resumed_from, first_step);
  const int64_t tokens_per_step = f.batch * f.seq;
  auto window_start = Clock::now();
  const auto run_start = window_start;
  double window_loss = 0;
  int64_t window_steps = 0;
  CheckpointProgress saves(f.checkpoint_dir, lead);
  reset_peak_memory_stats(device);
  for (int64_t step = first_step; step < f.steps; ++step) {
    // Every collective of the step carries its number: hang verdicts name the step.
    tessel::fr::FlightRecorder::global().set_step(step);
    const auto step_start = Clock::now();
    const auto [rows_x, rows_y] = data.next_train();  // this rank's rows of the global batch
    const auto [x, y] = cp_slice(rows_x, rows_y, f, layout);  // --cp: its part of each sequence
    const double loss = accumulate_gradients(*model, spec.vocab_size(), ddp.get(), x, y, f, layout,
                                             device, autocast);
    const double norm = clip_grad_norm(model->parameters(), f.clip);
    opt.set_lr(schedule.lr(step));
    opt.step();
    opt.zero_grad();
    if (moe_log) moe_log->after_step();  // the balancing bias, the step's expert counts
    const double step_loss = world_mean(world, loss);
    window_loss += step_loss;
    ++window_steps;
    if (json.is_open()) {
      const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
      json << fmt::format(
          "{{\"step\": {}, \"loss\": {:.6f}, \"grad_norm\": {:.6f}, \"lr\": {:.6g}, "
          "\"tokens_per_s\": {:.1f}, \"peak_memory_bytes\": {}{}}}\n",
          step + 1, step_loss, norm, opt.lr(), tokens_per_step / seconds,
          memory_stats(device).peak_allocated_bytes, moe_log ? moe_log->json_fields() : "");
      json.flush();
    }
    if ((step + 1) % f.log_every == 0 || step + 1 == f.steps) {
      const double seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
      const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      const double eta = elapsed / static_cast<double>(step + 1 - first_step) *
                         static_cast<double>(f.steps - step - 1);
      print(
          "step {:>5}/{} [{}] loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s{} | "
          "ETA {}\n",
          step + 1, f.steps, progress_bar(step + 1, f.steps), window_loss / window_steps, opt.lr(),
          norm, tokens_per_step * window_steps / seconds, moe_log ? moe_log->log_str() : "",
          duration_str(eta));
      std::fflush(stdout);
      window_loss = 0;
      window_steps = 0;
      window_start = Clock::now();
    }
    if (ckpt && f.checkpoint_every > 0 && (step + 1) % f.checkpoint_every == 0) {
      ckpt_state.step = step + 1;
      data.save(ckpt_state.metadata);
      saves.started(ckpt->async_save(ckpt_state), step + 1);  // waits for the previous one
    }
    if (f.eval_every > 0 && (step + 1) % f.eval_every == 0) {
      const double val_loss =
          evaluate_during_training(*model, spec.vocab_size(), data, f, layout, device, autocast);
      print("step {:>5}/{} val loss {:.4f}\n", step + 1, f.steps, val_loss);
      if (json.is_open()) {  // a line of its own: tessel-plot's validation-loss series
        json << fmt::format("{{\"step\": {}, \"val_loss\": {:.6f}}}\n", step + 1, val_loss);
        json.flush();
      }
      std::fflush(stdout);
    }
    saves.report(false);
  }
  saves.report(true);
  if (ckpt) ckpt->wait();
  const double total_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  // The whole model on rank 0 (a collective when sharded) for evaluation, saving and sampling.
  std::unique_ptr<nn::Module> whole = spec.make();
  {
    const nn::StateDict state = full_state_dict(*model);
    if (!lead) return 0;
    whole->load_state_dict(state);
  }
  fmt::print(
      "trained {} steps in {:.1f} s ({:.0f} tok/s); peak memory {:.1f} MiB; val loss "
      "{:.4f} nats/byte\n",
      f.steps - first_step, total_seconds, tokens_per_step * (f.steps - first_step) / total_seconds,
      memory_stats(device).peak_allocated_bytes / 1048576.0,
      evaluate(*whole, data.validation(0, 1, f.seed + 1), f));
  whole->save(f.checkpoint, {{"steps", std::to_string(f.steps)},
                             {"config", fmt::format("layers={} heads={} embd={} context={}",
                                                    f.layers, f.heads, f.embd, f.seq)}});
  fmt::print("saved checkpoint {}\n", f.checkpoint);
  if (!f.export_hf.empty()) {
    nn::save_hf(*whole, f.export_hf);
    fmt::print("exported the model in Hugging Face format to {}\n", f.export_hf);
  }
  // Byte-level tokens (and a document separator, 256) decode as bytes; other vocabularies need
  // their tokenizer, which train_gpt does not load.
  if (f.sample > 0 && spec.vocab_size() <= 257) {
    fmt::print("sample (temperature {}):\n{}{}\n", f.temperature, f.prompt,
               generate_text(*whole, spec.context(), f, f.sample));
  }
  return 0;
}

}  // namespace tessel::train_gpt
