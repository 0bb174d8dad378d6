// examples/train_gpt with checkpoints, run as a user runs it (tessel-run, real processes):
// resuming on the same world size continues bit for bit, on other world sizes within 1e-5; a
// worker SIGKILLed mid-training under --max-restarts resumes from the last checkpoint and
// finishes with the uninterrupted run's losses; tessel-ckpt inspects and consolidates, and the
// consolidated file loads into the single-process GPT and into Python's safetensors.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tessel/nn/gpt.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/safetensors.h"
#include "tests/launcher/child_process.h"
#include "tests/parallel/checkpoint_test_util.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using launcher::testing::ChildProcess;
using testing::TempDir;

constexpr int kSteps = 30;
constexpr auto kJobTimeout = std::chrono::seconds(120);

// The command line of a small, quick training run writing into `dir`.
std::vector<std::string> train_args(const TempDir& dir, const std::string& tag, int steps) {
  return {TRAIN_GPT_PATH,
          "--threads",
          "1",
          "--layers",
          "2",
          "--embd",
          "32",
          "--heads",
          "2",
          "--seq",
          "32",
          "--batch",
          "8",
          "--steps",
          std::to_string(steps),
          "--log-every",
          "10",
          "--sample",
          "0",
          "--checkpoint",
          dir / (tag + ".safetensors"),
          "--log-json",
          dir / (tag + ".jsonl"),
          "--checkpoint-every",
          "10",
          "--keep-checkpoints",
          "0"};
}

std::vector<std::string> under_tessel_run(int nproc, std::vector<std::string> args,
                                          std::vector<std::string> launcher_flags = {}) {
  std::vector<std::string> argv = {TESSEL_RUN_PATH, "--standalone", "--nproc-per-node",
                                   std::to_string(nproc)};
  argv.insert(argv.end(), launcher_flags.begin(), launcher_flags.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// Runs to the end; returns its stdout, failing the test on a non-zero exit.
std::string run(const std::vector<std::string>& argv, const TempDir& dir, const std::string& tag,
                const std::vector<std::string>& env = {}) {
  ChildProcess p(argv, env, dir / tag);
  const auto status = p.wait(kJobTimeout);
  EXPECT_EQ(status, 0) << tag << " stdout:\n" << p.out() << "\nstderr:\n" << p.err();
  return p.out();
}

// The loss of each step in a --log-json file; a step logged twice (before and after a restart)
// keeps its last value.
std::map<int, double> losses(const std::string& path) {
  std::map<int, double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    int step = 0;
    double loss = 0;
    if (std::sscanf(line.c_str(), "{\"step\": %d, \"loss\": %lf", &step, &loss) == 2) {
      out[step] = loss;
    }
  }
  return out;
}

// Steps from + 1 .. last of `got` against `want`: exactly, or within `rtol`.
void expect_losses(const std::map<int, double>& got, const std::map<int, double>& want, int from,
                   double rtol, int last = kSteps) {
  for (int step = from + 1; step <= last; ++step) {
    ASSERT_TRUE(got.contains(step) && want.contains(step)) << "step " << step;
    if (rtol == 0) {
      EXPECT_EQ(got.at(step), want.at(step)) << "step " << step;
    } else {
      EXPECT_NEAR(got.at(step), want.at(step), rtol * std::abs(want.at(step))) << "step " << step;
    }
  }
}

// A root holding only `step`'s checkpoint of `from`.
std::string root_with(const TempDir& dir, const std::string& from, int step,
                      const std::string& name) {
  const std::string root = dir / name;
  fs::create_directories(root);
  fs::copy(fs::path(from) / checkpoint::step_dir_name(step),
           fs::path(root) / checkpoint::step_dir_name(step), fs::copy_options::recursive);
  return root;
}

// 4-way FSDP saves at step 10; 4 processes resume bit for bit, 2 processes and one process
// within 1e-5 (their reductions add the same numbers in another order).
TEST(CheckpointTrainTest, ResumeOnTheSameWorldIsBitwiseAndOnOthersWithinTolerance) {
  TempDir dir;
  std::vector<std::string> args = train_args(dir, "ref", kSteps);
  args.insert(args.end(), {"--checkpoint-dir", dir / "ref_ck"});
  run(under_tessel_run(4, args), dir, "ref");
  const std::map<int, double> ref = losses(dir / "ref.jsonl");
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));

  for (int nproc : {4, 2, 1}) {
    SCOPED_TRACE(fmt::format("resumed on {} processes", nproc));
    const std::string tag = fmt::format("resume{}", nproc);
    args = train_args(dir, tag, kSteps);
    args.insert(args.end(),
                {"--checkpoint-dir", root_with(dir, dir / "ref_ck", 10, tag + "_ck"), "--resume"});
    const std::string out =
        nproc == 1 ? run(args, dir, tag) : run(under_tessel_run(nproc, args), dir, tag);
    EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
    const std::map<int, double> got = losses(dir / (tag + ".jsonl"));
    EXPECT_FALSE(got.contains(10));  // it did not train the first 10 steps again
    expect_losses(got, ref, 10, nproc == 4 ? 0 : 1e-5);
  }
}

// Tensor parallelism keeps the fused c_attn weight as (3, C, C) sections; its checkpoint holds
// the model's own (3C, C) shapes, so it reshards both ways: a (dp_shard 2, tp 2) job with
// sequence parallelism saves at step 10 and resumes on tp 2, 2-way FSDP and one process; a
// one-process and a 4-way FSDP checkpoint resume on (dp_shard 2, tp 2). Every resumed run
// continues with the (dp_shard 2, tp 2) run's losses, within 1e-5.
TEST(CheckpointTrainTest, TensorParallelCheckpointsReshardToAndFromOtherMeshes) {
  TempDir dir;
  const std::vector<std::string> mesh_2x2 = {"--dp-shard", "2", "--tp", "2", "--sequence-parallel"};
  std::vector<std::string> args = train_args(dir, "ref", kSteps);
  args.insert(args.end(), mesh_2x2.begin(), mesh_2x2.end());
  args.insert(args.end(), {"--checkpoint-dir", dir / "ref_ck"});
  run(under_tessel_run(4, args), dir, "ref");
  const std::map<int, double> ref = losses(dir / "ref.jsonl");
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));
  args = train_args(dir, "single", kSteps);
  args.insert(args.end(), {"--checkpoint-dir", dir / "single_ck"});
  run(args, dir, "single");
  args = train_args(dir, "fsdp4", kSteps);
  args.insert(args.end(), {"--checkpoint-dir", dir / "fsdp4_ck"});
  run(under_tessel_run(4, args), dir, "fsdp4");

  struct Resume {
    std::string tag, from;
    int nproc;
    std::vector<std::string> flags;
  };
  const std::vector<Resume> resumes = {{"tp2", "ref_ck", 2, {"--tp", "2"}},
                                       {"fsdp2", "ref_ck", 2, {}},
                                       {"one", "ref_ck", 1, {}},
                                       {"to_2x2", "single_ck", 4, mesh_2x2},
                                       {"fsdp4_to_2x2", "fsdp4_ck", 4, mesh_2x2}};
  for (const Resume& r : resumes) {
    SCOPED_TRACE(r.tag);
    args = train_args(dir, r.tag, kSteps);
    args.insert(args.end(), r.flags.begin(), r.flags.end());
    args.insert(args.end(),
                {"--checkpoint-dir", root_with(dir, dir / r.from, 10, r.tag + "_ck"), "--resume"});
    const std::string out =
        r.nproc == 1 ? run(args, dir, r.tag) : run(under_tessel_run(r.nproc, args), dir, r.tag);
    EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
    expect_losses(losses(dir / (r.tag + ".jsonl")), ref, 10, 1e-5);
  }
}

// A worker is SIGKILLed once the step-10 checkpoint exists (of 60 steps: the kill lands well
// before the end); tessel-run restarts the job, which resumes from the latest committed
// checkpoint and ends with the uninterrupted run's losses.
TEST(CheckpointTrainTest, KilledWorkerResumesFromTheLastCheckpointUnderMaxRestarts) {
  constexpr int kLongSteps = 60;
  TempDir dir;
  std::vector<std::string> args = train_args(dir, "ref", kLongSteps);
  args.insert(args.end(), {"--checkpoint-dir", dir / "ref_ck"});
  run(under_tessel_run(2, args), dir, "ref");
  const std::map<int, double> ref = losses(dir / "ref.jsonl");

  const std::string tag = fmt::format("CKPT_TRAIN_TEST={}", ::getpid());
  args = train_args(dir, "job", kLongSteps);
  args.insert(args.end(), {"--checkpoint-dir", dir / "job_ck", "--resume"});
  ChildProcess job(under_tessel_run(2, args, {"--max-restarts", "1"}), {tag}, dir / "job");
  ASSERT_TRUE(launcher::testing::wait_until(
      [&] { return fs::exists(dir / "job_ck/step_00000010/metadata.json"); },
      std::chrono::seconds(60)))
      << job.out() << job.err();
  // Rank 1 of this job: the processes carrying both our tag and RANK=1.
  const auto tagged = launcher::testing::pids_with_env(tag);
  int killed = 0;
  for (pid_t pid : launcher::testing::pids_with_env("RANK=1")) {
    if (std::find(tagged.begin(), tagged.end(), pid) != tagged.end()) {
      ::kill(pid, SIGKILL);
      ++killed;
    }
  }
  ASSERT_EQ(killed, 1);
  const auto status = job.wait(kJobTimeout);
  ASSERT_EQ(status, 0) << job.out() << job.err();
  EXPECT_NE(job.out().find("resumed from"), std::string::npos) << job.out();
  // The restarted attempt says so, and where it picks up; committed saves are reported.
  EXPECT_NE(job.out().find("restarting: attempt 2 of 2, resuming from step_000000"),
            std::string::npos)
      << job.out();
  // (Which save is reported first is a race: rank 0 prints the step-10 line after the commit
  // that releases the kill, so the kill may beat it; the restarted attempt's saves are printed.)
  EXPECT_NE(job.out().find("saved checkpoint " + (dir / "job_ck/step_000000")), std::string::npos)
      << job.out();
  expect_losses(losses(dir / "job.jsonl"), ref, 0, 0, kLongSteps);
}

// Two nodes (agents on this host, with a rendezvous server of their own) under --nnodes 1:2;
// one node's agent is SIGKILLed after the step-10 checkpoint. The job restarts on the node left —
// one process instead of two — which reshards the 2-way FSDP checkpoint on load and continues
// within 1e-5 of the 2-process run.
TEST(CheckpointTrainTest, ElasticRestartOnFewerNodesReshardsOnLoad) {
  TempDir dir;
  std::vector<std::string> args = train_args(dir, "ref", kSteps);
  args.insert(args.end(), {"--checkpoint-dir", dir / "ref_ck"});
  run(under_tessel_run(2, args), dir, "ref");
  const std::map<int, double> ref = losses(dir / "ref.jsonl");

  const std::string endpoint = fmt::format("127.0.0.1:{}", launcher::testing::free_port());
  const std::string token = dir / "token";
  std::ofstream(token) << "0123456789abcdef0123456789abcdef";
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write);
  // The server counts restarts, so it gets --max-restarts too; the agents only join it.
  ChildProcess server({TESSEL_RUN_PATH, "--rdzv-server", "--nnodes", "1:2", "--max-restarts", "1",
                       "--rdzv-endpoint", endpoint, "--rdzv-token-file", token},
                      {}, dir / "server");
  auto agent = [&](const std::string& tag) {
    std::vector<std::string> argv = {TESSEL_RUN_PATH,
                                     "--nnodes",
                                     "1:2",
                                     "--nproc-per-node",
                                     "1",
                                     "--rdzv-endpoint",
                                     endpoint,
                                     "--rdzv-conf",
                                     "is_host=false",
                                     "--rdzv-token-file",
                                     token,
                                     "--max-restarts",
                                     "1",
                                     "--last-call-timeout",
                                     "500ms"};
    std::vector<std::string> job = train_args(dir, tag, kSteps);
    job.insert(job.end(), {"--checkpoint-dir", dir / "job_ck", "--resume"});
    argv.insert(argv.end(), job.begin(), job.end());
    return argv;
  };
  ChildProcess a(agent("job"), {}, dir / "a");
  ChildProcess b(agent("job_b"), {}, dir / "b");
  ASSERT_TRUE(launcher::testing::wait_until(
      [&] { return fs::exists(dir / "job_ck/step_00000010/metadata.json"); },
      std::chrono::seconds(60)))
      << a.out() << a.err() << b.out() << b.err();
  b.signal(SIGKILL);
  const auto status = a.wait(kJobTimeout);
  ASSERT_EQ(status, 0) << a.out() << a.err();
  EXPECT_NE(a.out().find("resumed from"), std::string::npos) << a.out();
  // The first attempt ran on 2 nodes; the one after the restart on this node alone (one process
  // says nothing about parallelism).
  const std::string out = a.out();
  const size_t first = out.find("FSDP over 2 ranks");
  EXPECT_NE(first, std::string::npos) << out;
  EXPECT_EQ(out.find("FSDP over", first + 1), std::string::npos) << out;
  const std::map<int, double> got = losses(dir / "job.jsonl");
  expect_losses(got, ref, 10, 1e-5);
  EXPECT_EQ(server.wait(kJobTimeout), 0) << server.err();
}

// tessel-ckpt inspect and consolidate on a 2-process FSDP checkpoint; the consolidated model
// equals the one the run gathered and saved itself, loads into nn::GPT, and reads in Python.
TEST(CheckpointTrainTest, ToolInspectsAndConsolidatesForModuleLoadAndPython) {
  TempDir dir;
  std::vector<std::string> args = train_args(dir, "ref", 10);
  args.insert(args.end(), {"--checkpoint-dir", dir / "ck"});
  run(under_tessel_run(2, args), dir, "ref");

  // By default a summary by name prefix; --tensors lists every tensor and shard.
  const std::string summary = run({TESSEL_CKPT_PATH, "inspect", dir / "ck"}, dir, "summary");
  for (const char* part : {"step 10, saved by 2 ranks", "model.*  ", "optim.*  ", "files: 2"}) {
    EXPECT_NE(summary.find(part), std::string::npos) << part << " not in:\n" << summary;
  }
  EXPECT_EQ(summary.find("model.transformer.wte.weight"), std::string::npos) << summary;
  const std::string inspect =
      run({TESSEL_CKPT_PATH, "inspect", dir / "ck", "--verify", "--tensors"}, dir, "inspect");
  for (const char* part :
       {"step 10, saved by 2 ranks", "model.transformer.wte.weight f32[256, 32]",
        "rank_00001.safetensors", "optim.transformer.wte.weight.exp_avg", "verified"}) {
    EXPECT_NE(inspect.find(part), std::string::npos) << part << " not in:\n" << inspect;
  }
  const std::string out = dir / "model.safetensors";
  run({TESSEL_CKPT_PATH, "consolidate", dir / "ck", out}, dir, "consolidate");
  const SafetensorsFile got = load_safetensors(out),
                        want = load_safetensors(dir / "ref.safetensors");
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (const auto& [name, t] : want.tensors) {
    ASSERT_TRUE(got.tensors.contains(name)) << name;
    EXPECT_EQ(to_vector<float>(got.tensors.at(name)), to_vector<float>(t)) << name;
  }
  nn::GPT model({.vocab_size = 256, .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 32});
  model.load(out);
  EXPECT_EQ(to_vector<float>(model.state_dict().at("transformer.wte.weight")),
            to_vector<float>(want.tensors.at("transformer.wte.weight")));

  // A bad checkpoint writes nothing and says why.
  fs::remove(dir / "ck/step_00000010/rank_00001.safetensors");
  ChildProcess bad({TESSEL_CKPT_PATH, "consolidate", dir / "ck", dir / "bad.safetensors"}, {},
                   dir / "bad");
  EXPECT_EQ(bad.wait(kJobTimeout), 3);
  EXPECT_NE(bad.err().find("rank_00001.safetensors: shard file of tensor"), std::string::npos)
      << bad.err();
  EXPECT_FALSE(fs::exists(dir / "bad.safetensors"));

  // Python's safetensors (numpy) reads the same names, shapes and values.
  const std::string python = SAFETENSORS_PYTHON;
  if (std::system(
          fmt::format("'{}' -c 'import safetensors, numpy' >/dev/null 2>&1", python).c_str()) !=
      0) {
    GTEST_SKIP() << python << " cannot import safetensors and numpy (scripts/torch-venv.sh, then "
                 << "pip install safetensors numpy); the Python check was skipped";
  }
  const std::string script = fmt::format(
      "from safetensors.numpy import load_file\n"
      "a = load_file('{}'); b = load_file('{}')\n"
      "assert sorted(a) == sorted(b), (sorted(a), sorted(b))\n"
      "assert all(a[k].shape == b[k].shape and (a[k] == b[k]).all() for k in a)\n"
      "print('python safetensors ok', len(a))\n",
      out, dir / "ref.safetensors");
  std::ofstream(dir / "check.py") << script;
  const std::string py = run({python, dir / "check.py"}, dir, "python");
  EXPECT_NE(py.find("python safetensors ok"), std::string::npos) << py;
}

}  // namespace
}  // namespace tessel
