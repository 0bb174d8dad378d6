// Unchanged PyTorch programs under tessel-run: torch.distributed with the Gloo backend
// (init_process_group from torchrun's environment) all_reduces across the workers, and an
// exception inside torch's @record lands in the failure report through TORCHELASTIC_ERROR_FILE.
// Uses the Python named by TESSEL_TEST_TORCH_PYTHON at configure time (default
// /tmp/torch-venv/bin/python); skipped, with the reason, where it cannot import torch (CI).
#include <gtest/gtest.h>

#include <fstream>

#include "child_process.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;

const std::string kPython = TORCH_PYTHON;

class TorchGlooTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) != 0) {
      GTEST_SKIP() << kPython << " cannot import torch (set TESSEL_TEST_TORCH_PYTHON to a Python "
                   << "with torch at configure time)";
    }
    dir_ = testing::make_temp_dir("torch");
  }
  std::string dir_;
};

TEST_F(TorchGlooTest, UnchangedProgramAllReducesOverGloo) {
  std::ofstream(dir_ + "/train.py")
      << "import torch, torch.distributed as dist\n"
         "dist.init_process_group('gloo')\n"
         "t = torch.tensor([float(dist.get_rank() + 1)])\n"
         "dist.all_reduce(t)\n"
         "print(f'torch rank {dist.get_rank()} of {dist.get_world_size()} sum {int(t.item())}')\n"
         "dist.destroy_process_group()\n";
  // Importing torch in three processes saturates a 2-core machine: a heartbeat bound of 5 s
  // (1 s x 5) keeps the agent's own heartbeats from looking lost meanwhile.
  ChildProcess run({TESSEL_RUN_PATH, "--standalone", "--nproc-per-node", "3", "--monitor-interval",
                    "1s", "--log-dir", dir_ + "/logs", dir_ + "/train.py"},
                   {"TESSEL_PYTHON=" + kPython}, dir_ + "/run");
  ASSERT_EQ(run.wait(120s), 0) << run.err();
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(run.out().find("torch rank " + std::to_string(r) + " of 3 sum 6"), std::string::npos)
        << run.out() << run.err();
  }
}

TEST_F(TorchGlooTest, RecordedExceptionReachesTheReport) {
  std::ofstream(dir_ + "/fail.py")
      << "import os\n"
         "from torch.distributed.elastic.multiprocessing.errors import record\n"
         "@record\n"
         "def main():\n"
         "    if os.environ['RANK'] == '1':\n"
         "        raise ValueError('loss became nan at step 7')\n"
         "main()\n";
  ChildProcess run({TESSEL_RUN_PATH, "--standalone", "--nproc-per-node", "2", "--monitor-interval",
                    "1s", "--log-dir", dir_ + "/logs", dir_ + "/fail.py"},
                   {"TESSEL_PYTHON=" + kPython}, dir_ + "/run");
  ASSERT_EQ(run.wait(120s), 1) << run.err();
  EXPECT_NE(run.err().find("TORCHELASTIC_ERROR_FILE"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("loss became nan at step 7"), std::string::npos) << run.err();
}

}  // namespace
}  // namespace tessel::launcher
