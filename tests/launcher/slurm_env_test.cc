// What tessel-run takes from Slurm's environment (launcher/slurm_env.h): hostlist expressions,
// the srun step, the rendezvous endpoint on the step's first node, workers per node from the
// allocation; and the same through parse_launch_options. Environments are as srun 22.05 sets
// them (see tests/launcher/slurm_test.cc for the real thing).
#include "tessel/launcher/slurm_env.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/base/error.h"

namespace tessel::launcher {
namespace {

using Hosts = std::vector<std::string>;

TEST(HostlistTest, ExpandsRangesListsAndPadding) {
  EXPECT_EQ(expand_hostlist("node0"), (Hosts{"node0"}));
  EXPECT_EQ(expand_hostlist("node[0-2]"), (Hosts{"node0", "node1", "node2"}));
  EXPECT_EQ(expand_hostlist("node[0-2,5],gpu01"),
            (Hosts{"node0", "node1", "node2", "node5", "gpu01"}));
  EXPECT_EQ(expand_hostlist("n[008-010]"), (Hosts{"n008", "n009", "n010"}));
  EXPECT_EQ(expand_hostlist("n[9-11]"), (Hosts{"n9", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("r[1-2]-n[1-2]"), (Hosts{"r1-n1", "r1-n2", "r2-n1", "r2-n2"}));
  EXPECT_EQ(expand_hostlist("a[1],b[3-4].lan,c"), (Hosts{"a1", "b3.lan", "b4.lan", "c"}));
}

TEST(HostlistTest, RejectsMalformedExpressionsNamingThem) {
  for (const char* bad : {"node[0-2", "node0-2]", "node[2-0]", "node[a-b]", "node[]", "n[[1]]",
                          "node0,,node1", "node[1-]"}) {
    try {
      expand_hostlist(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// srun --nodes 3 --ntasks-per-node 1, as seen by the task on the second node.
Environment srun_env() {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_NNODES", "3"},
          {"SLURM_STEP_NUM_NODES", "3"},
          {"SLURM_NODEID", "1"},
          {"SLURM_PROCID", "1"},
          {"SLURM_NTASKS", "3"},
          {"SLURM_STEP_NODELIST", "node[0-2]"},
          {"SLURM_JOB_NODELIST", "node[0-3]"},
          {"SLURM_CPUS_ON_NODE", "4"}};
}

TEST(SlurmStepTest, ReadsTheStep) {
  const auto step = read_slurm_step(srun_env());
  ASSERT_TRUE(step);
  EXPECT_EQ(step->nnodes, 3);
  EXPECT_EQ(step->node_rank, 1);
  EXPECT_EQ(step->job_id, "4242");
  EXPECT_EQ(step->first_node, "node0");
}

TEST(SlurmStepTest, AStepOnPartOfTheAllocationUsesTheStepsNodes) {
  Environment env = srun_env();
  env["SLURM_STEP_NUM_NODES"] = "2";
  env["SLURM_STEP_NODELIST"] = "node[2-3]";
  const auto step = read_slurm_step(env);
  ASSERT_TRUE(step);
  EXPECT_EQ(step->nnodes, 2);
  EXPECT_EQ(step->first_node, "node2");
}

TEST(SlurmStepTest, TheBatchScriptIsNoStep) {
  const Environment batch{{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "0"}};
  EXPECT_FALSE(read_slurm_step(batch));
  EXPECT_TRUE(in_slurm_batch_script(batch));
  EXPECT_FALSE(in_slurm_batch_script(srun_env()));
}

TEST(SlurmStepTest, MalformedVariablesAreNamed) {
  for (auto [key, value] : {std::pair{"SLURM_NODEID", "x"},
                            {"SLURM_NODEID", "3"},
                            {"SLURM_STEP_NUM_NODES", "-1"},
                            {"SLURM_STEP_NODELIST", "node[0-1]"},
                            {"SLURM_STEP_NODELIST", "node[0-"}}) {
    Environment env = srun_env();
    env[key] = value;
    try {
      read_slurm_step(env);
      ADD_FAILURE() << key << "=" << value << " was accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find(key) != std::string::npos || what.find(value) != std::string::npos)
          << what;
    }
  }
}

TEST(SlurmEndpointTest, FirstNodesAddressAndAPortFromTheJobId) {
  const auto step = *read_slurm_step(srun_env());
  const auto no_slurm = [](const std::string&) { return std::string(); };
  // "localhost" stands in for a resolvable first node.
  SlurmStep local = step;
  local.first_node = "localhost";
  EXPECT_EQ(slurm_rdzv_endpoint(local, srun_env(),
                                [](const std::string&) { return std::string("127.0.0.1"); }),
            "127.0.0.1:29642");  // 29400 + 4242 % 1000
  Environment env = srun_env();
  env["MASTER_ADDR"] = "10.0.0.9";
  env["MASTER_PORT"] = "1234";
  EXPECT_EQ(slurm_rdzv_endpoint(step, env, no_slurm), "10.0.0.9:1234");
  // A name nothing resolves: the error says what to give instead.
  SlurmStep unknown = step;
  unknown.first_node = "no-such-node.invalid";
  try {
    slurm_rdzv_endpoint(unknown, srun_env(), no_slurm);
    ADD_FAILURE() << "an unresolvable node was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-node.invalid"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--rdzv-endpoint"), std::string::npos) << e.what();
  }
}

// A name that maps to loopback here (Debian's 127.0.1.1 for the host's own name) is asked of
// Slurm (scontrol show node's NodeAddr), which others can reach.
TEST(SlurmEndpointTest, ALoopbackAddressIsReplacedBySlurmsNodeAddr) {
  std::string asked;
  const std::string addr = resolve_node_address("localhost", [&](const std::string& node) {
    asked = node;
    return std::string("10.1.2.3");
  });
  EXPECT_EQ(asked, "localhost");
  EXPECT_EQ(addr, "10.1.2.3");
  // Slurm knows nothing better: keep what getaddrinfo said.
  EXPECT_EQ(resolve_node_address("localhost", [](const std::string&) { return std::string(); }),
            "127.0.0.1");
}

TEST(SlurmNprocTest, GpusFirstThenTheTasksCpus) {
  Environment env = srun_env();
  EXPECT_EQ(slurm_nproc_per_node("auto", env), 4);  // SLURM_CPUS_ON_NODE
  EXPECT_EQ(slurm_nproc_per_node("cpu", env), 4);
  env["SLURM_CPUS_PER_TASK"] = "3";  // srun --cpus-per-task 3: this task's share
  EXPECT_EQ(slurm_nproc_per_node("auto", env), 3);
  env["SLURM_STEP_GPUS"] = "0,1";
  EXPECT_EQ(slurm_nproc_per_node("auto", env), 2);
  EXPECT_EQ(slurm_nproc_per_node("gpu", env), 2);
  EXPECT_EQ(slurm_nproc_per_node("cpu", env), 3);
  env["SLURM_GPUS_ON_NODE"] = "8";
  EXPECT_EQ(slurm_nproc_per_node("gpu", env), 8);
  EXPECT_FALSE(slurm_nproc_per_node("auto", Environment{}));
  EXPECT_THROW(slurm_nproc_per_node("gpu", srun_env()), InvalidArgument);
}

ParseResult parse(std::vector<std::string> args, const Environment& env) {
  std::vector<const char*> argv{"tessel-run"};
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_launch_options(static_cast<int>(argv.size()), argv.data(), env);
}

TEST(SlurmOptionsTest, AnUnchangedScriptTakesEverythingFromSrun) {
  Environment env = srun_env();
  env["SLURM_STEP_NODELIST"] = "localhost,node[1-2]";
  env["SLURM_CPUS_PER_TASK"] = "2";
  auto r = parse({"--nproc-per-node", "auto", "prog"}, env);
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->topology_source, "slurm");
  EXPECT_EQ(r.options->min_nodes, 3);
  EXPECT_EQ(r.options->max_nodes, 3);
  EXPECT_EQ(r.options->node_rank, 1);
  EXPECT_EQ(r.options->rdzv_id, "4242");
  EXPECT_EQ(r.options->rdzv_endpoint, "127.0.0.1:29642");
  EXPECT_EQ(r.options->nproc_per_node, 2);
  // An elastic range under srun: the rest still comes from the step.
  r = parse({"--nnodes", "2:3", "prog"}, env);
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->min_nodes, 2);
  EXPECT_EQ(r.options->max_nodes, 3);
  EXPECT_EQ(r.options->node_rank, 1);
  EXPECT_EQ(r.options->rdzv_id, "4242");
  EXPECT_EQ(r.options->rdzv_endpoint, "127.0.0.1:29642");
  // Flags still win.
  r = parse({"--nnodes", "1", "--standalone", "--rdzv-id", "x", "prog"}, env);
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->max_nodes, 1);
  EXPECT_EQ(r.options->rdzv_id, "x");
  EXPECT_EQ(r.options->topology_source, "flags");
}

TEST(SlurmOptionsTest, BadSlurmVariablesFailTheParseNamingThem) {
  Environment env = srun_env();
  env["SLURM_STEP_NODELIST"] = "node[0-";
  auto r = parse({"prog"}, env);
  EXPECT_FALSE(r.options);
  EXPECT_EQ(r.exit_status, exit_status(ExitCode::kInvalidConfig));
  EXPECT_NE(r.message.find("node[0-"), std::string::npos) << r.message;
}

TEST(SlurmOptionsTest, InTheBatchScriptItRunsOnThisNodeWithANote) {
  const Environment batch{{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "0"}};
  auto r = parse({"prog"}, batch);
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->max_nodes, 1);
  EXPECT_TRUE(r.options->standalone);
  ASSERT_EQ(r.options->notes.size(), 1u);
  EXPECT_NE(r.options->notes[0].find("srun --ntasks-per-node 1"), std::string::npos);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// docs/launching.md shows examples/slurm/train_gpt.sbatch, which slurm_test runs: the page's
// copy is the file, word for word.
TEST(SlurmDocsTest, TheSbatchExampleOnThePageIsTheFileTheTestsRun) {
  const std::string script = read_text(SBATCH_EXAMPLE_PATH);
  ASSERT_FALSE(script.empty()) << SBATCH_EXAMPLE_PATH;
  EXPECT_NE(read_text(LAUNCHING_DOC_PATH).find("```sh\n" + script + "```\n"), std::string::npos)
      << "docs/launching.md's sbatch example differs from " << SBATCH_EXAMPLE_PATH;
}

}  // namespace
}  // namespace tessel::launcher
