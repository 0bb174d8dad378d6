#pragma once
// Test helper: a real Slurm cluster for a test binary (scripts/slurm-testbed.sh): slurmctld on a
// login node and one slurmd per network-namespace node, node0..node<N-1> at 10.79.1.<i+1>.
//
//   static std::unique_ptr<SlurmTestbed> bed;                      // in SetUpTestSuite:
//   bed = SlurmTestbed::start(SLURM_TESTBED_PATH, 3, dir, &why, &skipped);  // ~1 s; or null
//   auto job = bed->login({"srun", "--nodes", "3", "hostname"}, "hostnames");
//   int status = bed->sbatch({"--nodes", "2", "job.sbatch"}, "job");
//   bed.reset();                                                   // in TearDownTestSuite
//
// The cluster also goes when the test process is killed (the script's reaper). Not
// thread-safe: one test thread uses it.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "child_process.h"

namespace tessel::launcher::testing {

class SlurmTestbed {
 public:
  // Starts a cluster of `nodes` nodes in DIR/cluster (DIR must exist; outputs of the commands
  // run go to DIR too). Null when it cannot run here, with the reason in *why ("needs root...")
  // and `skipped` true, or when it failed to start (`skipped` false).
  static std::unique_ptr<SlurmTestbed> start(const std::string& script, int nodes,
                                             const std::string& dir, std::string* why,
                                             bool* skipped);
  // Stops the cluster and checks that nothing of it is left (a gtest failure otherwise).
  ~SlurmTestbed();
  SlurmTestbed(const SlurmTestbed&) = delete;
  SlurmTestbed& operator=(const SlurmTestbed&) = delete;

  // Starts CMD on the login node (srun, sbatch, scontrol...) with `env` ("NAME=value") added and
  // the set_path() folders in front of PATH; output in DIR/TAG.out, .err.
  std::unique_ptr<ChildProcess> start_login(const std::vector<std::string>& cmd,
                                            const std::string& tag,
                                            const std::vector<std::string>& env = {}) const;
  // The same, run to the end (a gtest failure when it does not end within `timeout`).
  std::unique_ptr<ChildProcess> login(
      const std::vector<std::string>& cmd, const std::string& tag,
      const std::vector<std::string>& env = {},
      std::chrono::seconds timeout = std::chrono::seconds(120)) const;
  // Submits a batch job (sbatch ARGS) and waits for its end by polling its state (sbatch --wait
  // polls every few seconds); returns its exit code, 128 + signal, or -1 when it did not end in
  // `timeout` (a gtest failure).
  int sbatch(std::vector<std::string> args, const std::string& tag,
             const std::vector<std::string>& env = {},
             std::chrono::seconds timeout = std::chrono::seconds(180)) const;

  // Folders put in front of PATH for every command (build outputs, as after an install).
  void set_path(const std::vector<std::string>& dirs);
  const std::string& conf() const { return conf_; }  // DIR/cluster/slurm.conf
  static std::string node_addr(int i) { return "10.79.1." + std::to_string(i + 1); }

 private:
  SlurmTestbed(std::string script, std::string dir) : script_(script), dir_(dir) {}

  std::string script_, dir_, cluster_, conf_, path_;
};

}  // namespace tessel::launcher::testing
