// fsdp_cuda_bench: a GPT training step under FSDP on one GPU (world size 1), tessel beside
// PyTorch FSDP2 on the same GPU with the same configuration, initial weights and token batches,
// in one run; and the communication FSDP leaves exposed per step.
//
//   fsdp_cuda_bench                                # GPT-2 124M, bf16 autocast, B=8, T=1024
//   fsdp_cuda_bench --torch python3                # + PyTorch (single, FSDP2, FSDP2 no-comm)
//   fsdp_cuda_bench --layers 2 --steps 10 --trace-dir /tmp/fsdp_trace   # + a flight-recorder
//       dump of the FSDP run: tessel-trace export /tmp/fsdp_trace --perfetto trace.json
//   fsdp_cuda_bench --device cpu --dtype f32 --layers 1 --embd 64 --heads 2 --vocab 256
//       --seq 32 --batch 2 --torch python3         # the plumbing on the CPU (threads / Gloo)
//
// Setups, each side:
//   single        the plain model on the device (no FSDP);
//   fsdp          fully_shard on every block, then the root, over a world of one rank: NCCL on
//                 a GPU (collectives on the group's stream, ordered by events), the threads
//                 backend on the CPU; PyTorch: FSDP2's fully_shard over NCCL (Gloo on the CPU);
//   fsdp no-comm  the same over a process group whose collectives move nothing (tessel's fake
//                 backend, PyTorch's fake process group): FSDP's own work without communication.
// Exposed communication per step = fsdp - fsdp no-comm: what the collectives add to the step
// after overlapping with compute (with one rank they are device-to-device copies, so this is
// the floor of what the overlap machinery leaves exposed). "comm" is the device time of
// tessel's collectives per step (flight recorder: NCCL's start/end events), hidden or not.
// FSDP cost = fsdp - single. Tokens/s = B * T / median step; the ratio is tessel FSDP over
// PyTorch FSDP2. Both sides: the model and optimizer of gpt_cuda_bench (AdamW lr 6e-4, betas
// 0.9/0.95, weight decay 0.1, clipping at 1.0), bf16 = autocast with f32 parameters; every
// step ends with the loss read on the host. No-comm runs train on garbage (nothing is
// gathered), so their losses are not shown.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_gpt.h"
#include "tessel/base/error.h"
#include "tessel/collectives/fake/fake_backend.h"
#include "tessel/collectives/nccl/nccl_backend.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/store/memory_store.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"

#ifndef TESSEL_SOURCE_DIR
#define TESSEL_SOURCE_DIR "."
#endif

namespace {

using namespace tessel;
using bench::GptRun;

struct Flags {
  bench::GptShape shape{.batch = 8};  // GPT-2 124M, B=8, T=1024
  std::string dtype = "bf16";
  std::string device = "cuda:0";
  std::string torch = "none";  // python with torch, or none
  std::string torch_script = TESSEL_SOURCE_DIR "/bench/fsdp_cuda/fsdp_cuda_torch.py";
  std::string work_dir;
  std::string trace_dir;
};

enum class Setup { kSingle, kFsdp, kFsdpNoComm };

std::string setup_name(Setup setup) {
  return setup == Setup::kSingle ? "tessel single"
         : setup == Setup::kFsdp ? "tessel fsdp"
                                 : "tessel fsdp no-comm";
}

struct TesselRun {
  GptRun run;
  double comm_s = 0;  // device time of the collectives per timed step
};

constexpr uint64_t kGroupId = 0xf5d9;  // the flight recorder's id of the bench's world

// The world of one rank FSDP runs over: NCCL on a GPU, the threads backend on the CPU, the fake
// backend for no-comm.
std::shared_ptr<ProcessGroup> world_of(Setup setup, Device device) {
  const ProcessGroupOptions group{.name = "fsdp_bench", .id = kGroupId};
  if (setup == Setup::kFsdpNoComm) return fake::create_process_group(0, 1, nullptr, group);
  if (device.is_cuda()) {
    return nccl::create_process_group(std::make_shared<MemoryStore>(), 0, 1,
                                      NcclOptions{.device = device.index, .group = group});
  }
  return threads::create_world(1, group).front();
}

// Device time of the collectives recorded after `first_record` during steps >= `from_step`,
// per step.
double comm_seconds_per_step(uint64_t first_record, int64_t from_step, int steps) {
  int64_t total_ns = 0;
  for (const fr::Entry& e : fr::FlightRecorder::global().snapshot()) {
    const bool user = e.op == fr::OpType::kUserEvent || e.op == fr::OpType::kUserSpan;
    if (e.record_id <= first_record || user || e.step < from_step ||
        e.state != fr::EntryState::kCompleted) {
      continue;
    }
    total_ns += e.completed_ns - e.started_ns;
  }
  return static_cast<double>(total_ns) * 1e-9 / std::max(steps, 1);
}

TesselRun run_tessel(const Flags& f, const nn::GptConfig& config,
                     const std::vector<int32_t>& tokens, Device device, Setup setup) {
  auto& recorder = fr::FlightRecorder::global();
  const uint64_t first_record = recorder.recorded();
  nn::GPT model(config);  // the weights of init.safetensors
  model.to(device);
  std::shared_ptr<ProcessGroup> world;
  std::unique_ptr<DeviceMesh> mesh;
  if (setup != Setup::kSingle) {
    world = world_of(setup, device);
    mesh = std::make_unique<DeviceMesh>(init_device_mesh(world, {1}, {"dp"}));
    auto& blocks = model.submodule("transformer.h");
    for (int64_t i = 0; i < config.n_layer; ++i)
      fully_shard(blocks.child(std::to_string(i)), *mesh);
    fully_shard(model, *mesh);
  }
  const bool trace = setup == Setup::kFsdp && !f.trace_dir.empty();
  auto clip = [&] {
    if (world) {
      clip_grad_norm(model.parameters(), 1.0);  // parallel/fsdp/clip_grad_norm.h: over the shards
    } else {
      nn::optim::clip_grad_norm(model.parameters(), 1.0);
    }
  };
  // Steps are stamped on the flight recorder's entries; the traced run also marks its phases.
  auto mark = [&](int step, std::string_view phase) {
    if (phase == "forward") recorder.set_step(step);
    if (trace) recorder.record_event(fmt::format("step {} {}", step, phase));
  };
  TesselRun out;
  out.run = bench::train_steps(model, f.shape, tokens, device, f.dtype == "bf16", clip, mark);
  out.run.name = setup_name(setup);
  if (setup == Setup::kFsdp) {
    out.comm_s = comm_seconds_per_step(first_record, f.shape.warmup, f.shape.steps);
  }
  if (trace) {
    recorder.set_process_info(0, 1);  // the dump's rank: tessel-trace reads worlds of ranks
    const auto path =
        fr::write_dump(recorder, {fr::DumpTrigger::kApi, -1, "fsdp_cuda_bench"}, f.trace_dir);
    fmt::print(
        "flight-recorder dump of the FSDP run: {} (tessel-trace export {} --perfetto "
        "trace.json)\n",
        path.string(), f.trace_dir);
  }
  return out;
}

GptRun run_torch(const Flags& f, const std::string& mode, const std::filesystem::path& dir) {
  const std::string cmd = fmt::format(
      "PYTHONWARNINGS=ignore '{}' '{}' --mode {} --init '{}' --tokens '{}' {} --dtype {} "
      "--attention {} --device {} 2>&1",
      f.torch, f.torch_script, mode, (dir / "init.safetensors").string(),
      (dir / "tokens.i32").string(), f.shape.peer_flags(), f.dtype,
      f.dtype == "bf16" ? "sdpa" : "plain", f.device);
  return bench::run_peer(cmd, "torch " + mode);
}

// Milliseconds, or n/a when unmeasured.
std::string ms(std::optional<double> seconds) {
  return seconds ? fmt::format("{:.2f}", *seconds * 1e3) : "n/a";
}

int run(const Flags& f) {
  const Device device = parse_device(f.device);
  if (device.is_cuda() && cuda::device_count() == 0) {
    fmt::print("fsdp_cuda_bench: skipped, no CUDA device: {}\n", cuda::unavailable_reason());
    return 0;
  }
  check_device_available(device);
  TESSEL_CHECK(f.dtype == "bf16" || f.dtype == "f32", InvalidArgument,
               "--dtype {}: expected bf16 or f32", f.dtype);
  const bench::GptShape& s = f.shape;
  const nn::GptConfig config = s.config();
  const std::filesystem::path dir = f.work_dir.empty()
                                        ? std::filesystem::temp_directory_path() / "fsdp_cuda_bench"
                                        : std::filesystem::path(f.work_dir);
  const std::vector<int32_t> tokens = bench::make_tokens(s);
  bench::write_peer_inputs(dir, tokens, config);

  const std::string name = device.is_cuda() ? cuda::device_name(device.index) : "the CPU";
  fmt::print(
      "fsdp_cuda_bench on {} ({}): GPT {} layers, {} heads, {} wide, context {}, vocab {}; "
      "batch {} x {} = {} tokens/step; {}; world of one rank ({}); {} warm-up + {} timed "
      "steps\n",
      device.str(), name, s.layers, s.heads, s.embd, s.seq, s.vocab, s.batch, s.seq,
      s.batch * s.seq, f.dtype == "bf16" ? "bf16 autocast" : "f32",
      device.is_cuda() ? "NCCL" : "threads backend", s.warmup, s.steps);
  std::fflush(stdout);

  std::vector<TesselRun> ours;
  for (Setup setup : {Setup::kSingle, Setup::kFsdp, Setup::kFsdpNoComm}) {
    try {
      ours.push_back(run_tessel(f, config, tokens, device, setup));
    } catch (const Error& e) {
      TesselRun failed;
      failed.run.name = setup_name(setup);
      failed.run.note = e.what();
      ours.push_back(failed);
    }
    empty_cache(device);
  }
  std::vector<GptRun> theirs;
  if (f.torch != "none") {
    for (const char* mode : {"single", "fsdp2", "fsdp2-nocomm"}) {
      theirs.push_back(run_torch(f, mode, dir));
    }
  }

  fmt::print("\n{:<22} {:>12} {:>10} {:>11} {:>9} {:>9} {:>12}\n", "setup", "tokens/s", "ms/step",
             "peak mem", "loss 1", "loss end", "comm ms/step");
  auto row = [&](const GptRun& r, double comm_s, bool show_loss) {
    if (r.step_s <= 0) {
      fmt::print("{:<22} {}\n", r.name, r.note.empty() ? "no result" : r.note);
      return;
    }
    const bool losses = show_loss && !r.losses.empty();
    fmt::print("{:<22} {:>12.0f} {:>10.2f} {:>11} {:>9} {:>9} {:>12}\n", r.name,
               static_cast<double>(s.batch * s.seq) / r.step_s, r.step_s * 1e3,
               bytes_str(r.peak_bytes), losses ? fmt::format("{:.4f}", r.losses.front()) : "-",
               losses ? fmt::format("{:.4f}", r.losses.back()) : "-",
               comm_s > 0 ? ms(comm_s) : "n/a");
  };
  for (size_t i = 0; i < ours.size(); ++i) row(ours[i].run, ours[i].comm_s, i < 2);
  for (size_t i = 0; i < theirs.size(); ++i) row(theirs[i], 0, i < 2);

  // Differences of medians (negative within noise); n/a where a side failed.
  auto diff = [](const GptRun& a, const GptRun& b) -> std::optional<double> {
    if (a.step_s <= 0 || b.step_s <= 0) return std::nullopt;
    return a.step_s - b.step_s;
  };
  fmt::print(
      "\nexposed communication per step (fsdp - fsdp no-comm): tessel {} ms (of {} ms of "
      "collectives on the device)",
      ms(diff(ours[1].run, ours[2].run)), ms(ours[1].comm_s));
  if (theirs.size() == 3) fmt::print(", PyTorch FSDP2 {} ms", ms(diff(theirs[1], theirs[2])));
  fmt::print("\nFSDP cost per step (fsdp - single): tessel {} ms",
             ms(diff(ours[1].run, ours[0].run)));
  if (theirs.size() == 3) fmt::print(", PyTorch FSDP2 {} ms", ms(diff(theirs[1], theirs[0])));
  fmt::print("\n");
  if (theirs.size() == 3 && ours[1].run.step_s > 0 && theirs[1].step_s > 0) {
    fmt::print("tokens/s, tessel FSDP / PyTorch FSDP2: {:.3f}x\n",
               theirs[1].step_s / ours[1].run.step_s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"GPT training under FSDP on one GPU: tessel beside PyTorch FSDP2"};
  f.shape.add_options(app);
  app.add_option("--dtype", f.dtype, "bf16 (autocast, f32 parameters) or f32");
  app.add_option("--device", f.device, "the CUDA device (cpu: the plumbing only)");
  app.add_option("--torch", f.torch, "python with torch for the peer, or none");
  app.add_option("--torch-script", f.torch_script, "the peer script (fsdp_cuda_torch.py)");
  app.add_option("--work-dir", f.work_dir, "where the shared weights and tokens are written");
  app.add_option("--trace-dir", f.trace_dir,
                 "write a flight-recorder dump of the FSDP run here (for tessel-trace export)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const tessel::Error& e) {
    fmt::print(stderr, "fsdp_cuda_bench: {}\n", e.what());
    return 1;
  }
}
