// A 2x2 mesh over Gloo with 4 real processes (forked, FileStore rendezvous).
#include <gtest/gtest.h>

#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/store/file_store.h"
#include "tests/collectives/fork_harness.h"
#include "tests/mesh/mesh_check.h"

namespace tessel {
namespace {

TEST(DeviceMeshGlooTest, TwoByTwoOverFourProcesses) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const auto outcomes = testing::run_processes(
      4,
      [](int rank, const std::string& store_dir) {
        auto store = std::make_shared<FileStore>(store_dir);
        GlooOptions options;
        options.hostname = "127.0.0.1";
        options.group.timeout = std::chrono::seconds(30);
        testing::check_two_by_two_mesh(gloo::create_process_group(store, rank, 4, options));
      },
      std::chrono::seconds(90));
  for (const auto& o : outcomes) {
    EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
  }
}

}  // namespace
}  // namespace tessel
