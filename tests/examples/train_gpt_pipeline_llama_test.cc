// train_gpt --pp --model llama as a user runs it, composed with the data parallelism inside the
// stages: 20 steps of a tiny Llama print the losses of one process within f32 relative 2e-4
// (micro-batch and data-parallel gradients summed in another order) — untied, pipelined over 2
// of 8 Gloo processes with HSDP (--dp-replicate 2 x dp_shard 2) inside the stages; tied
// (--tie-embeddings), with zero-bubble and DDP (--ddp) over the other 2 of 4. A Llama with --tp
// and a --dp-replicate that does not divide the data-parallel ranks fail naming the flags.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/examples/train_gpt_log.h"
#include "tests/examples/train_gpt_run.h"

namespace {

using namespace train_gpt_test;

constexpr double kLossRtol = 2e-4;

class TrainGptPipelineLlamaTest : public TrainGptRunTest {
 protected:
  TrainGptPipelineLlamaTest() : TrainGptRunTest("train_gpt_pp_llama") {}

  std::vector<std::string> training(const std::string& log,
                                    std::vector<std::string> more = {}) const {
    std::vector<std::string> args = {
        "--threads",  "1", "--steps",      "20",
        "--batch",    "8", "--seq",        "32",
        "--layers",   "4", "--embd",       "32",
        "--heads",    "4", "--model",      "llama",
        "--sample",   "0", "--log-every",  "10",
        "--log-json", log, "--checkpoint", (dir_ / (log + ".st")).string()};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  // Runs one process and `launcher` with `pipeline` flags (both with `model` flags) and checks
  // that the pipeline prints `banner` and the one-process losses.
  void expect_parity(const std::string& launcher, const std::vector<std::string>& model,
                     std::vector<std::string> pipeline, const std::string& banner) {
    Result one = run(TRAIN_GPT_PATH, training("one.jsonl", model));
    ASSERT_EQ(one.status, 0) << one.err;
    pipeline.insert(pipeline.end(), model.begin(), model.end());
    Result pp = run(launcher, training("pp.jsonl", pipeline));
    ASSERT_EQ(pp.status, 0) << pp.out << pp.err;
    EXPECT_NE(pp.out.find(banner), std::string::npos) << pp.out;
    const auto want = logged_losses(dir_ / "one.jsonl");
    const auto got = logged_losses(dir_ / "pp.jsonl");
    ASSERT_EQ(want.size(), 20u);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [step, loss] : want) {
      EXPECT_NEAR(got.at(step), loss, kLossRtol * loss) << "step " << step;
    }
  }
};

// (pp, dp_replicate, dp_shard) = (2, 2, 2) on 8 processes, an untied Llama.
TEST_F(TrainGptPipelineLlamaTest, UntiedWithHsdpOnEightProcessesMatchesOneProcess) {
  const std::string eight =
      fmt::format("'{}' --standalone --nproc-per-node 8 '{}'", TESSEL_RUN_PATH, TRAIN_GPT_PATH);
  expect_parity(eight, {}, {"--pp", "2", "--dp-replicate", "2", "--microbatches", "2"},
                "pipeline of 2 ranks x 2 dp_replicate x 2 dp_shard x 1 tp, schedule 1f1b");
}

// (pp, dp) = (2, 2) with DDP inside the stages and zero-bubble, a tied Llama (the head's
// gradient summed over the first and last stages' ranks).
TEST_F(TrainGptPipelineLlamaTest, TiedWithDdpAndZeroBubbleMatchesOneProcess) {
  expect_parity(on_four_ranks(), {"--tie-embeddings"},
                {"--pp", "2", "--ddp", "--pp-schedule", "zero-bubble"},
                "pipeline of 2 ranks x 2 ddp x 1 tp, schedule zero-bubble");
}

TEST_F(TrainGptPipelineLlamaTest, UnsupportedCombinationsAreNamed) {
  Result tp = run(on_four_ranks(), {"--pp", "2", "--model", "llama", "--tp", "2"});
  EXPECT_NE(tp.status, 0);
  EXPECT_NE((tp.out + tp.err).find("--pp 2 with --model llama and --tp: not supported yet"),
            std::string::npos)
      << tp.out << tp.err;
  Result replicas = run(on_four_ranks(), {"--pp", "2", "--dp-replicate", "3"});
  EXPECT_NE(replicas.status, 0);
  EXPECT_NE((replicas.out + replicas.err)
                .find("--dp-replicate 3 does not divide the 2 data-parallel ranks"),
            std::string::npos)
      << replicas.out << replicas.err;
}

}  // namespace
