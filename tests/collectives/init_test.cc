// init_process_group and the launcher environment (torchrun/tessel-run, mpirun, Slurm).

#include "tessel/collectives/init.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "tessel/base/error.h"
#include "tessel/store/store_server.h"

namespace tessel {
namespace {

const char* kVars[] = {"RANK",
                       "WORLD_SIZE",
                       "LOCAL_RANK",
                       "MASTER_ADDR",
                       "MASTER_PORT",
                       "OMPI_COMM_WORLD_RANK",
                       "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK",
                       "SLURM_PROCID",
                       "SLURM_NTASKS",
                       "SLURM_LOCALID",
                       "TESSEL_STORE_ADDR",
                       "TESSEL_STORE_DIR",
                       "TESSEL_PG_BACKEND",
                       "TESSEL_STORE_TOKEN",
                       "TESSEL_STORE_TOKEN_FILE"};

class InitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) ::unsetenv(v);
  }
  void TearDown() override { SetUp(); }
};

TEST_F(InitTest, ReadsTorchrunThenMpiThenSlurm) {
  EXPECT_EQ(read_launch_env().launcher, "none");
  ::setenv("SLURM_PROCID", "3", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  auto env = read_launch_env();
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  env = read_launch_env();
  EXPECT_EQ(env.launcher, "mpirun");
  EXPECT_EQ(env.rank, 2);
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "10.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  env = read_launch_env();
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
}

// The GPU a process owns, set before any CUDA work: the requested one, else the launcher's
// local rank (under every launcher), else the rank, modulo the visible devices.
TEST_F(InitTest, ProcessDeviceFollowsTheLaunchersLocalRank) {
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  EXPECT_EQ(process_cuda_device(read_launch_env(), Device::cpu(), 4), 1) << "not rank 5 % 4";
  ::setenv("OMPI_COMM_WORLD_RANK", "6", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(process_cuda_device(read_launch_env(), Device::cpu(), 4), 3);
  ::setenv("RANK", "7", 1);
  ::setenv("WORLD_SIZE", "8", 1);
  ::setenv("LOCAL_RANK", "2", 1);
  const LaunchEnv env = read_launch_env();
  EXPECT_EQ(process_cuda_device(env, Device::cpu(), 8), 2);
  EXPECT_EQ(process_cuda_device(env, Device::cpu(), 2), 0) << "modulo the visible devices";
  EXPECT_EQ(process_cuda_device(env, Device::cuda(5), 8), 5) << "a requested device wins";
  EXPECT_THROW(process_cuda_device(env, Device::cuda(8), 8), InvalidArgument);
  EXPECT_THROW(process_cuda_device(env, Device::cpu(), 0), Unavailable);
  ::unsetenv("LOCAL_RANK");
  EXPECT_EQ(process_cuda_device(read_launch_env(), Device::cpu(), 4), 3) << "no local rank: rank";
}

TEST_F(InitTest, RejectsBadNumbersAndRanks) {
  ::setenv("RANK", "x", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  EXPECT_THROW(read_launch_env(), InvalidArgument);
  ::setenv("RANK", "2", 1);
  EXPECT_THROW(read_launch_env(), InvalidArgument);
}

TEST_F(InitTest, WorldOfOneWithoutALauncher) {
  auto pg = init_process_group();
  EXPECT_EQ(pg->size(), 1);
  EXPECT_EQ(pg->backend_name(), "threads");
  Tensor t = from_vector<float>({2});
  pg->all_reduce(t);
  EXPECT_EQ(t.data<float>()[0], 2.0f);
}

TEST_F(InitTest, GlooThroughAFileStore) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  char pattern[] = "/tmp/tessel-init-XXXXXX";
  ::setenv("TESSEL_STORE_DIR", ::mkdtemp(pattern), 1);
  auto pg = init_process_group({.backend = "gloo", .gloo = {.hostname = "127.0.0.1"}});
  EXPECT_EQ(pg->backend_name(), "gloo");
  EXPECT_EQ(pg->size(), 1);
}

// As under tessel-run: the world rendezvouses through the job's gRPC store at
// TESSEL_STORE_ADDR, authenticated by TESSEL_STORE_TOKEN.
TEST_F(InitTest, GlooThroughTheJobsStoreServer) {
  if (!StoreServer::is_available()) GTEST_SKIP() << "this build has no gRPC store";
  StoreServer server(StoreServerOptions{});
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("TESSEL_STORE_ADDR", server.address().c_str(), 1);
  ::setenv("TESSEL_STORE_TOKEN", server.token().c_str(), 1);
  auto pg = init_process_group({.backend = "gloo"});
  EXPECT_EQ(pg->size(), 1);
  EXPECT_GT(server.stats().keys, 0u);  // the Gloo bootstrap went through the server
}

TEST_F(InitTest, StoreServerNeedsTheToken) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  try {
    init_process_group({.backend = "gloo"});
    FAIL() << "connected to a store without a token";
  } catch (const Error& e) {
    const std::string m = e.message();
    EXPECT_TRUE(e.kind() == ErrorKind::kInvalidArgument || e.kind() == ErrorKind::kUnavailable)
        << e.what();
    EXPECT_NE(m.find("127.0.0.1:29500"), std::string::npos) << m;
  }
  EXPECT_THROW(init_process_group({.backend = "bogus"}), InvalidArgument);
}

}  // namespace
}  // namespace tessel
