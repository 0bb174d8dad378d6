// tessel under a real Slurm (22.05, Debian's packages): scripts/slurm-testbed.sh starts
// slurmctld on a login node and one slurmd per node, each a network namespace, once for the
// whole suite (ctest runs this binary as one test, SlurmTest). Through real srun and sbatch:
// tessel-run takes its topology from Slurm; docs/launching.md's sbatch example
// (examples/slurm/train_gpt.sbatch) trains FSDP on 2 and 3 nodes with the losses of
// `tessel-run --standalone` on as many workers; under `srun --mpi=pmix` the collectives' MPI
// test runs, and train_gpt runs on the MPI backend with the same losses. Skipped, with the
// reason ("slurm-testbed: SKIP"), without root, namespaces or the Slurm packages.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "child_process.h"
#include "slurm_testbed.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;

const std::string kTestbed = SLURM_TESTBED_PATH;
const std::string kRun = TESSEL_RUN_PATH;
const std::string kWorker = TEST_WORKER_PATH;
const std::string kTrainGpt = TRAIN_GPT_PATH;
const std::string kSbatchExample = SBATCH_EXAMPLE_PATH;
const std::string kToken = "TESSEL_RDZV_TOKEN=slurm-test-token-0123456789";
constexpr int kNodes = 3;

// Directory of a path ("/a/b/c" -> "/a/b").
std::string dir_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class SlurmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto t0 = std::chrono::steady_clock::now();
    dir_ = testing::make_temp_dir("slurm");
    bed_ = testing::SlurmTestbed::start(kTestbed, kNodes, dir_, &why_, &skipped_);
    if (skipped_) std::printf("slurm-testbed: SKIP (%s)\n", why_.c_str());
    if (!bed_) return;
    bed_->set_path({dir_of(kRun), dir_of(kTrainGpt)});
    std::printf("test bed of %d nodes up in %.2f s\n", kNodes, seconds_since(t0));
  }

  static void TearDownTestSuite() {
    if (!bed_) return;
    const auto t0 = std::chrono::steady_clock::now();
    bed_.reset();  // stops it and checks that nothing is left
    std::printf("test bed down in %.2f s\n", seconds_since(t0));
  }

  void SetUp() override {
    if (skipped_) GTEST_SKIP() << why_;
    ASSERT_TRUE(bed_) << why_;
  }

  // CMD on the login node, with the job token in the environment.
  std::unique_ptr<ChildProcess> start_login(std::vector<std::string> cmd, const std::string& tag,
                                            std::vector<std::string> env = {}) {
    env.push_back(kToken);
    return bed_->start_login(cmd, tag, env);
  }
  std::unique_ptr<ChildProcess> login(std::vector<std::string> cmd, const std::string& tag) {
    return bed_->login(cmd, tag, {kToken});
  }

  // The loss of each step of a --log-json file.
  static std::map<int, double> losses(const std::string& path) {
    std::map<int, double> out;
    std::istringstream in(testing::read_file(path));
    int step = 0;
    double loss = 0;
    for (std::string line; std::getline(in, line);) {
      if (std::sscanf(line.c_str(), "{\"step\": %d, \"loss\": %lf", &step, &loss) == 2)
        out[step] = loss;
    }
    return out;
  }

  // train_gpt's flags for a tiny, quick FSDP run logging to DIR/TAG.jsonl.
  static std::vector<std::string> train_flags(const std::string& tag) {
    return {"--threads",    "1",
            "--layers",     "2",
            "--embd",       "32",
            "--heads",      "2",
            "--seq",        "32",
            "--batch",      "12",
            "--steps",      "20",
            "--log-every",  "10",
            "--sample",     "0",
            "--log-json",   dir_ + "/" + tag + ".jsonl",
            "--checkpoint", dir_ + "/" + tag + ".safetensors"};
  }

  // The same training under `tessel-run --standalone` with `workers` workers (once each).
  static const std::map<int, double>& standalone_losses(int workers) {
    static std::map<int, std::map<int, double>> cache;
    if (!cache.contains(workers)) {
      const std::string tag = "standalone" + std::to_string(workers);
      std::vector<std::string> argv{kRun, "--standalone", "--nproc-per-node",
                                    std::to_string(workers), kTrainGpt};
      for (auto& f : train_flags(tag)) argv.push_back(f);
      ChildProcess p(argv, {}, dir_ + "/" + tag);
      EXPECT_EQ(p.wait(120s), 0) << p.err();
      cache[workers] = losses(dir_ + "/" + tag + ".jsonl");
      EXPECT_EQ(cache[workers].size(), 20u) << tag;
    }
    return cache[workers];
  }

  static inline std::string dir_, why_;
  static inline bool skipped_ = false;
  static inline std::unique_ptr<testing::SlurmTestbed> bed_;
};

// srun --nodes 3 --ntasks-per-node 1 tessel-run (no --nnodes, --node-rank, --rdzv-*): the
// step's nodes, each node's rank from SLURM_NODEID, one Gloo world across the nodes.
TEST_F(SlurmTest, SrunStartsOneTesselRunPerNodeWithSlurmsTopology) {
  const auto t0 = std::chrono::steady_clock::now();
  auto job = login({"srun", "--nodes", "3", "--ntasks-per-node", "1", kRun, "--nproc-per-node", "2",
                    kWorker, "all_reduce"},
                   "srun-all-reduce");
  ASSERT_EQ(job->wait(0s), 0) << job->out() << job->err();
  std::set<int> ranks;
  const std::regex re(R"(^\[(\d):(\d)\] all_reduce rank (\d) of 6 sum 21$)");
  std::istringstream in(job->out());
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    ASSERT_TRUE(std::regex_match(line, m, re)) << line;
    EXPECT_EQ(std::stoi(m[3]) / 2, std::stoi(m[1]));  // node i (SLURM_NODEID) holds 2i, 2i+1
    ranks.insert(std::stoi(m[3]));
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3, 4, 5}));
  std::printf("srun of 3 tessel-runs x 2 workers: %.2f s\n", seconds_since(t0));
}

// --nproc-per-node auto is the task's CPUs (srun --cpus-per-task 3); the run id is the job id
// and MASTER_ADDR the step's first node (node0, 10.79.1.1).
TEST_F(SlurmTest, AutoWorkersFromTheAllocationAndTheJobIdAsRunId) {
  auto job = login({"srun", "--nodes", "2", "--ntasks-per-node", "1", "--cpus-per-task", "3", kRun,
                    "--nproc-per-node", "auto", kWorker, "env"},
                   "srun-auto");
  ASSERT_EQ(job->wait(0s), 0) << job->out() << job->err();
  std::map<std::string, std::map<std::string, std::string>> env;  // "[n:r]" -> name -> value
  const std::regex re(R"(^(\[\d:\d\]) ENV ([A-Z_]+)=(.*)$)");
  std::istringstream in(job->out());
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_match(line, m, re)) env[m[1]][m[2]] = m[3];
  }
  ASSERT_EQ(env.size(), 6u) << job->out();  // 2 nodes x 3 CPUs
  for (auto& [worker, vars] : env) {
    EXPECT_EQ(vars["WORLD_SIZE"], "6") << worker;
    EXPECT_EQ(vars["LOCAL_WORLD_SIZE"], "3") << worker;
    EXPECT_FALSE(vars["SLURM_JOB_ID"].empty());
    EXPECT_EQ(vars["TORCHELASTIC_RUN_ID"], vars["SLURM_JOB_ID"]) << worker;
    EXPECT_EQ(vars["MASTER_ADDR"], "10.79.1.1") << worker;
    EXPECT_EQ(vars["GROUP_RANK"], vars["SLURM_NODEID"]) << worker;
  }
}

// scancel of a running job: Slurm's SIGTERM reaches every node's tessel-run, which stops its
// workers and exits 143 (128 + SIGTERM); nothing of the job is left on any node.
TEST_F(SlurmTest, ScancelStopsEveryNodeAndLeavesNoProcess) {
  const std::string marker = "LAUNCH_TEST_MARKER=" + dir_ + "/cancel";
  auto job =
      start_login({"srun", "--job-name", "tessel-cancel", "--nodes", "3", "--ntasks-per-node", "1",
                   kRun, "--nproc-per-node", "2", kWorker, "sleep"},
                  "scancel-job", {marker});
  // srun, 3 agents and 6 workers carry the marker once the job runs.
  ASSERT_TRUE(testing::wait_until([&] { return testing::pids_with_env(marker).size() >= 10; }, 60s))
      << job->err();
  const auto t0 = std::chrono::steady_clock::now();
  auto cancel = login({"scancel", "--name", "tessel-cancel"}, "scancel");
  ASSERT_EQ(cancel->wait(0s), 0) << cancel->err();
  ASSERT_TRUE(job->wait(60s).has_value()) << job->err();
  EXPECT_NE(job->wait(0s), 0);
  const std::string err = job->err();
  size_t stopped = 0;
  for (size_t at = err.find("tessel-run exits with status 143"); at != std::string::npos;
       at = err.find("tessel-run exits with status 143", at + 1))
    ++stopped;
  EXPECT_GE(stopped, 3u) << err;  // every node's agent (a failed job also repeats it in its report)
  EXPECT_TRUE(testing::wait_until([&] { return testing::pids_with_env(marker).empty(); }, 30s))
      << testing::pids_with_env(marker).size() << " processes of the job left";
  std::printf("scancel to the job's end on every node: %.2f s\n", seconds_since(t0));
}

// With GPUs in the allocation (the test bed's nodes have 2 each, without devices behind them),
// auto is one worker per GPU, whatever the CPUs; `gpu` on an allocation without any fails on
// every node, saying why, before any worker starts.
TEST_F(SlurmTest, AutoWorkersFollowTheAllocationsGpus) {
  auto job = login({"srun", "--nodes", "2", "--ntasks-per-node", "1", "--gpus-per-node", "2", kRun,
                    "--nproc-per-node", "auto", kWorker, "env"},
                   "srun-gpus");
  ASSERT_EQ(job->wait(0s), 0) << job->out() << job->err();
  const std::string out = job->out();
  size_t workers = 0;
  for (size_t at = out.find("ENV LOCAL_WORLD_SIZE=2\n"); at != std::string::npos;
       at = out.find("ENV LOCAL_WORLD_SIZE=2\n", at + 1))
    ++workers;
  EXPECT_EQ(workers, 4u) << out;
  EXPECT_NE(out.find("ENV SLURM_GPUS_ON_NODE=2\n"), std::string::npos) << out;

  auto none = login({"srun", "--nodes", "2", "--ntasks-per-node", "1", kRun, "--nproc-per-node",
                     "gpu", kWorker, "env"},
                    "srun-no-gpus");
  EXPECT_EQ(none->wait(0s), 65) << none->err();  // invalid config
  const std::string err = none->err();
  size_t said = 0;
  for (size_t at = err.find("the Slurm allocation has no GPUs"); at != std::string::npos;
       at = err.find("the Slurm allocation has no GPUs", at + 1))
    ++said;
  EXPECT_EQ(said, 2u) << err;
  EXPECT_EQ(none->out().find("ENV "), std::string::npos) << none->out();
}

// docs/launching.md's sbatch example as written (examples/slurm/train_gpt.sbatch), one CPU per
// node: FSDP over 2 and over 3 nodes gives the losses of the same job on one node.
TEST_F(SlurmTest, SbatchExampleTrainsFsdpWithTheLossesOfAStandaloneRun) {
  for (int nodes : {2, 3}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string tag = "sbatch" + std::to_string(nodes);
    std::vector<std::string> args{
        "--nodes",  std::to_string(nodes),         "--cpus-per-task", "1", "--chdir", dir_,
        "--output", dir_ + "/" + tag + ".job.out", kSbatchExample};
    for (auto& f : train_flags(tag)) args.push_back(f);
    const int status = bed_->sbatch(args, tag);
    const std::string out = testing::read_file(dir_ + "/" + tag + ".job.out");
    ASSERT_EQ(status, 0) << out;
    EXPECT_NE(out.find(std::to_string(nodes) + " nodes, world size " + std::to_string(nodes)),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("FSDP over " + std::to_string(nodes) + " ranks (gloo)"), std::string::npos)
        << out;
    const double took = seconds_since(t0);
    const auto got = losses(dir_ + "/" + tag + ".jsonl");
    EXPECT_EQ(got, standalone_losses(nodes)) << nodes << " nodes";
    std::printf("sbatch of %d nodes: %.2f s from submission to the job's end\n", nodes, took);
  }
}

// srun --mpi=pmix (Debian's Open MPI 4.1 speaks PMIx, not PMI-2): the collectives' MPI test
// on 3 nodes, and train_gpt started by srun itself (no tessel-run) on the MPI backend with the
// losses of the standalone run.
TEST_F(SlurmTest, MpiBackendUnderSrunPmix) {
  auto list = login({"srun", "--mpi=list"}, "mpi-list");
  if ((list->out() + list->err()).find("pmix") == std::string::npos)
    GTEST_SKIP() << "this Slurm has no PMIx plugin: " << list->out() << list->err();
#ifdef MPI_BACKEND_TEST_PATH
  auto t0 = std::chrono::steady_clock::now();
  auto checks =
      login({"srun", "--mpi=pmix", "--nodes", "3", "--ntasks-per-node", "1", MPI_BACKEND_TEST_PATH},
            "mpi-backend-test");
  ASSERT_EQ(checks->wait(0s), 0) << checks->out() << checks->err();
  const std::string out = checks->out();
  size_t passed = 0;
  for (size_t at = out.find("[  PASSED  ]"); at != std::string::npos;
       at = out.find("[  PASSED  ]", at + 1))
    ++passed;
  EXPECT_EQ(passed, 3u) << out;  // every rank's whole suite
  EXPECT_EQ(out.find("SKIPPED"), std::string::npos) << out;
  std::printf("mpi_backend_test under srun --mpi=pmix on 3 nodes: %.2f s\n", seconds_since(t0));
#else
  GTEST_SKIP() << "this build has no MPI backend";
#endif
  std::vector<std::string> cmd{"srun", "--mpi=pmix", "--nodes", "2", "--ntasks-per-node",
                               "1",    kTrainGpt};
  for (auto& f : train_flags("mpi2")) cmd.push_back(f);
  auto train = login(cmd, "mpi-train");
  ASSERT_EQ(train->wait(0s), 0) << train->out() << train->err();
  EXPECT_NE(train->out().find("FSDP over 2 ranks (mpi)"), std::string::npos) << train->out();
  EXPECT_EQ(losses(dir_ + "/mpi2.jsonl"), standalone_losses(2));
}

// The closed loop under Slurm (docs/launching.md#recovery): an elastic job (--nnodes 2:3)
// started by srun on 3 nodes; rank 5 on node2 stops taking part at step 5; the verdict names
// it, node2 is taken out of the job and drained in Slurm (--drain-excluded), and the job
// resumes from its step-4 checkpoint on node0 and node1. Runs last: it resumes node2 after.
TEST_F(SlurmTest, HungRankOnANodeDrainsItAndTheJobContinuesOnTheOthers) {
  const std::string ckpt = dir_ + "/closed-loop";
  std::filesystem::create_directories(ckpt);
  std::vector<std::string> cmd{"srun", "--nodes", "3", "--ntasks-per-node", "1", kRun, "--nnodes",
                               "2:3", "--nproc-per-node", "2", "--max-restarts", "2",
                               "--last-call-timeout", "300ms", "--hang-dump-timeout", "5s",
                               "--drain-excluded", kWorker,
                               // train DIR STEPS EVERY HANG_RANK HANG_STEP TIMEOUT_S PACE_MS
                               "train", ckpt, "10", "2", "5", "5", "2", "0"};
  const auto t0 = std::chrono::steady_clock::now();
  auto job = login(cmd, "closed-loop");
  const std::string err = job->err(), out = job->out();
  // node2's tessel-run is refused when it joins again (exit 76, which srun passes on); the
  // others finish the job.
  EXPECT_EQ(job->wait(0s), 76) << err;
  EXPECT_NE(err.find("node 2 (10.79.1.3, host node2) taken out of the job for its life "
                     "(culprit ranks 5)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("round 1 started: 2 nodes, world size 4"), std::string::npos) << err;
  size_t succeeded = 0;
  for (size_t at = err.find("job succeeded"); at != std::string::npos;
       at = err.find("job succeeded", at + 1))
    ++succeeded;
  EXPECT_EQ(succeeded, 2u) << err;
  EXPECT_NE(out.find("[0:0] resumed from step 4 world 4 attempt 1"), std::string::npos) << out;
  std::printf("srun job with a hung rank on node2 to its end on node0 and node1: %.2f s\n",
              seconds_since(t0));
  // Slurm drained node2 with the verdict as the reason; then it is given back.
  auto node2 = login({"sinfo", "-h", "-N", "-n", "node2", "-o", "%T %E"}, "closed-loop-sinfo");
  EXPECT_EQ(node2->out().rfind("drained tessel verdict: round 0: rank 5", 0), 0u) << node2->out();
  auto resume = login({"scontrol", "update", "nodename=node2", "state=resume"}, "resume");
  EXPECT_EQ(resume->wait(0s), 0) << resume->err();
}

}  // namespace
}  // namespace tessel::launcher
