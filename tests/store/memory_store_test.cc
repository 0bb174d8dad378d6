#include "tessel/store/memory_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "tessel/base/error.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;

TEST(MemoryStoreTest, SetGetOverwrite) {
  MemoryStore store;
  store.set("a", "1");
  EXPECT_EQ(store.get("a"), "1");
  store.set("a", std::string("\0x\xff", 3));
  EXPECT_EQ(store.get("a"), std::string("\0x\xff", 3));
}

TEST(MemoryStoreTest, GetWaitsForALaterSet) {
  MemoryStore store;
  std::thread setter([&] { store.set("late", "value"); });
  EXPECT_EQ(store.get("late", 10s), "value");
  setter.join();
}

TEST(MemoryStoreTest, GetTimesOutNamingTheKey) {
  MemoryStore store;
  try {
    store.get("never", 20ms);
    FAIL() << "get returned for a key nobody set";
  } catch (const Timeout& e) {
    EXPECT_NE(e.message().find("'never'"), std::string::npos) << e.what();
  }
}

TEST(MemoryStoreTest, WaitNamesOnlyMissingKeys) {
  MemoryStore store;
  store.set("here", "");
  try {
    store.wait({"here", "gone1", "gone2"}, 10ms);
    FAIL();
  } catch (const Timeout& e) {
    EXPECT_NE(e.message().find("'gone1', 'gone2'"), std::string::npos) << e.what();
    EXPECT_EQ(e.message().find("'here'"), std::string::npos) << e.what();
  }
}

TEST(MemoryStoreTest, AddIsAtomicAcrossThreads) {
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) store.add("n", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store.add("n", 0), 8000);
  store.set("text", "abc");
  EXPECT_THROW(store.add("text", 1), InvalidArgument);
}

TEST(MemoryStoreTest, CompareSet) {
  MemoryStore store;
  EXPECT_EQ(store.compare_set("k", "x", "y"), "");  // missing key, non-empty expected: no-op
  EXPECT_FALSE(store.check({"k"}));
  EXPECT_EQ(store.compare_set("k", "", "first"), "first");
  EXPECT_EQ(store.compare_set("k", "wrong", "second"), "first");
  EXPECT_EQ(store.compare_set("k", "first", "second"), "second");
  EXPECT_EQ(store.get("k"), "second");
}

TEST(MemoryStoreTest, CheckDeleteMulti) {
  MemoryStore store;
  store.multi_set({"a", "b"}, {"1", "2"});
  EXPECT_TRUE(store.check({"a", "b"}));
  EXPECT_EQ(store.multi_get({"b", "a"}), (std::vector<std::string>{"2", "1"}));
  EXPECT_TRUE(store.delete_key("a"));
  EXPECT_FALSE(store.delete_key("a"));
  EXPECT_FALSE(store.check({"a", "b"}));
  EXPECT_THROW(store.multi_set({"a"}, {}), InvalidArgument);
}

TEST(PrefixStoreTest, NamespacesKeys) {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore dp("group/dp", base), tp("group/tp", base);
  dp.set("id", "A");
  tp.set("id", "B");
  EXPECT_EQ(dp.get("id"), "A");
  EXPECT_EQ(tp.get("id"), "B");
  EXPECT_EQ(base->get("group/dp/id"), "A");
  EXPECT_EQ(dp.add("count", 2), 2);
  EXPECT_TRUE(base->check({"group/dp/count"}));
  EXPECT_THROW(PrefixStore("x", nullptr), InvalidArgument);
}

}  // namespace
}  // namespace tessel
