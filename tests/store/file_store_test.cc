// FileStore: the Store contract over a directory, across threads and forked processes.

#include "tessel/store/file_store.h"

#include <gtest/gtest.h>

#include "fork_harness.h"
#include "tessel/base/error.h"

namespace tessel {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string temp_dir() {
  char pattern[] = "/tmp/tessel-fs-XXXXXX";
  return ::mkdtemp(pattern);
}

TEST(FileStoreTest, SetGetAddCompareSetDelete) {
  FileStore store(temp_dir(), seconds(5));
  store.set("a/b", std::string("x\0y", 3));
  EXPECT_EQ(store.get("a/b"), std::string("x\0y", 3));
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -2), 3);
  EXPECT_EQ(store.compare_set("c", "", "one"), "one");
  EXPECT_EQ(store.compare_set("c", "two", "three"), "one");
  EXPECT_TRUE(store.check({"a/b", "n", "c"}));
  EXPECT_TRUE(store.delete_key("c"));
  EXPECT_FALSE(store.check({"c"}));
  store.multi_set({"k1", "k2"}, {"v1", "v2"});
  EXPECT_EQ(store.multi_get({"k1", "k2"}), (std::vector<std::string>{"v1", "v2"}));
  store.set("bad", "nope");
  EXPECT_THROW(store.add("bad", 1), InvalidArgument);
}

TEST(FileStoreTest, GetTimesOutNamingTheKey) {
  FileStore store(temp_dir());
  try {
    store.get("missing", milliseconds(50));
    FAIL();
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(FileStoreTest, AddIsAtomicAcrossProcesses) {
  const auto outcomes = testing::run_processes(
      4,
      [](int rank, const std::string& dir) {
        FileStore store(dir, seconds(20));
        for (int i = 0; i < 50; ++i) store.add("counter", 1);
        store.set("done/" + std::to_string(rank), "1");
        store.wait({"done/0", "done/1", "done/2", "done/3"}, seconds(20));
        if (store.get("counter") != "200")
          throw std::runtime_error("counter " + store.get("counter"));
      },
      seconds(40));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
}

}  // namespace
}  // namespace tessel
