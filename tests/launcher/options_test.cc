#include "tessel/launcher/options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessel::launcher {
namespace {

ParseResult parse(std::vector<std::string> args, const Environment& env = {}) {
  std::vector<const char*> argv{"tessel-run"};
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_launch_options(static_cast<int>(argv.size()), argv.data(), env);
}

TEST(OptionsTest, AcceptsUnderscoreAndDashSpellings) {
  for (const char* flag : {"--nproc-per-node", "--nproc_per_node"}) {
    auto r = parse({flag, "3", "--max_restarts=2", "prog"});
    ASSERT_TRUE(r.options) << r.message;
    EXPECT_EQ(r.options->nproc_per_node, 3);
    EXPECT_EQ(r.options->max_restarts, 2);
  }
}

TEST(OptionsTest, EverythingAfterProgramGoesToIt) {
  auto r = parse({"--standalone", "prog", "--nproc-per-node", "7", "-x", "--", "y"});
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->program, "prog");
  EXPECT_EQ(r.options->program_args,
            (std::vector<std::string>{"--nproc-per-node", "7", "-x", "--", "y"}));
  EXPECT_EQ(r.options->nproc_per_node, 1);
  EXPECT_TRUE(r.options->standalone);
}

TEST(OptionsTest, PetVariablesAreDefaultsThatFlagsOverride) {
  Environment env{{"PET_NPROC_PER_NODE", "4"},
                  {"PET_MAX_RESTARTS", "5"},
                  {"PET_NNODES", "2:3"},
                  {"PET_RDZV_ENDPOINT", "10.0.0.1:29400"}};
  auto r = parse({"--max-restarts", "1", "prog"}, env);
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->nproc_per_node, 4);
  EXPECT_EQ(r.options->max_restarts, 1);
  EXPECT_EQ(r.options->min_nodes, 2);
  EXPECT_EQ(r.options->max_nodes, 3);
  EXPECT_EQ(r.options->rdzv_endpoint, "10.0.0.1:29400");
}

TEST(OptionsTest, NnodesRange) {
  EXPECT_EQ(parse_nnodes("3"), std::make_pair(3, 3));
  EXPECT_EQ(parse_nnodes("1:4"), std::make_pair(1, 4));
  for (const char* bad : {"3:2", "0", "0:2", "x", "2:", ":3"}) {
    auto r = parse({"--nnodes", bad, "--rdzv-endpoint", "h:1", "prog"});
    EXPECT_FALSE(r.options) << bad;
    EXPECT_EQ(r.exit_status, exit_status(ExitCode::kInvalidConfig)) << bad;
    EXPECT_NE(r.message.find(bad), std::string::npos) << r.message;
  }
}

TEST(OptionsTest, BadInputHasDistinctExitStatuses) {
  const auto unknown = parse({"--no-such-flag", "prog"});
  const auto no_program = parse({"--nproc-per-node", "2"});
  const auto bad_value = parse({"--nproc-per-node", "0", "prog"});
  const auto multi_without_endpoint = parse({"--nnodes", "2", "prog"});
  EXPECT_EQ(unknown.exit_status, exit_status(ExitCode::kUsage));
  EXPECT_NE(unknown.message.find("--no-such-flag"), std::string::npos);
  EXPECT_EQ(no_program.exit_status, exit_status(ExitCode::kUsage));
  EXPECT_EQ(bad_value.exit_status, exit_status(ExitCode::kInvalidConfig));
  EXPECT_EQ(multi_without_endpoint.exit_status, exit_status(ExitCode::kInvalidConfig));
  EXPECT_NE(exit_status(ExitCode::kUsage), exit_status(ExitCode::kInvalidConfig));
}

TEST(OptionsTest, UsesMpirunTopology) {
  Environment env{{"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_RANK", "2"},
                  {"MASTER_ADDR", "10.1.1.1"},
                  {"MASTER_PORT", "29500"}};
  auto r = parse({"prog"}, env);
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->max_nodes, 4);
  EXPECT_EQ(r.options->node_rank, 2);
  EXPECT_EQ(r.options->rdzv_endpoint, "10.1.1.1:29500");
  EXPECT_EQ(r.options->topology_source, "mpirun");
}

// Inside an srun step (SLURM_STEP_ID); tests/launcher/slurm_env_test.cc has the rest.
TEST(OptionsTest, UsesSlurmTopology) {
  Environment env{{"SLURM_NNODES", "3"},  {"SLURM_NODEID", "1"}, {"SLURM_JOB_ID", "777"},
                  {"SLURM_STEP_ID", "0"}, {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "1234"}};
  auto r = parse({"prog"}, env);
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->max_nodes, 3);
  EXPECT_EQ(r.options->node_rank, 1);
  EXPECT_EQ(r.options->rdzv_id, "777");
  EXPECT_EQ(r.options->rdzv_endpoint, "n1:1234");
  EXPECT_EQ(r.options->topology_source, "slurm");
}

TEST(OptionsTest, StandaloneIsSingleNode) {
  auto r = parse({"--standalone", "--nnodes", "2", "prog"});
  EXPECT_EQ(r.exit_status, exit_status(ExitCode::kInvalidConfig));
}

TEST(OptionsTest, RedirectsAndRankFilter) {
  auto r = parse({"--redirects", "2", "--local-ranks-filter", "0,2", "prog"});
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_FALSE(r.options->redirects.selects(0, WorkerStream::kStdout));
  EXPECT_TRUE(r.options->redirects.selects(0, WorkerStream::kStderr));
  EXPECT_TRUE(r.options->redirects.selects(5, WorkerStream::kStderr));
  EXPECT_EQ(*r.options->local_ranks_filter, (std::set<int>{0, 2}));
}

// torchrun's per-rank form: local rank 0 keeps stdout off the console, rank 1 both streams.
TEST(OptionsTest, RedirectsPerLocalRank) {
  auto r = parse({"--redirects", "0:1,1:3", "prog"});
  ASSERT_TRUE(r.options) << r.message;
  const StreamSelection& s = r.options->redirects;
  EXPECT_TRUE(s.selects(0, WorkerStream::kStdout));
  EXPECT_FALSE(s.selects(0, WorkerStream::kStderr));
  EXPECT_TRUE(s.selects(1, WorkerStream::kStdout));
  EXPECT_TRUE(s.selects(1, WorkerStream::kStderr));
  EXPECT_FALSE(s.selects(2, WorkerStream::kStdout));  // unlisted ranks: 0
  for (const char* bad : {"0:4", "x:1", "0:1,2", "-1:1", "5"}) {
    auto b = parse({"--redirects", bad, "prog"});
    EXPECT_FALSE(b.options) << bad;
    EXPECT_NE(b.message.find("--redirects/--tee"), std::string::npos) << bad << ": " << b.message;
  }
}

TEST(OptionsTest, HelpListsEveryFlagWithItsDefault) {
  auto r = parse({"--help"});
  EXPECT_EQ(r.exit_status, 0);
  for (const char* flag :
       {"--nnodes", "--nproc-per-node", "--standalone", "--rdzv-endpoint", "--rdzv-id",
        "--node-rank", "--max-restarts", "--monitor-interval", "--log-dir", "--redirects", "--tee",
        "--local-ranks-filter", "--master-addr", "--master-port", "--rdzv-server", "--dump-on-hang",
        "--rdzv-token-file"}) {
    EXPECT_NE(r.message.find(flag), std::string::npos) << flag;
  }
  EXPECT_NE(r.message.find("=1:1"), std::string::npos);
  EXPECT_NE(r.message.find("=100ms"), std::string::npos);
}

}  // namespace
}  // namespace tessel::launcher
