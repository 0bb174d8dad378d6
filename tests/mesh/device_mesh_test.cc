#include "tessel/mesh/device_mesh.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"

namespace tessel {
namespace {

using Shape64 = std::vector<int64_t>;

// Independent model: world rank r sits at the mixed-radix digits of r over the shape; its group
// along dims `along` is every rank agreeing on the other digits, ordered row-major over `along`.
std::vector<int64_t> coords_of(int64_t r, const Shape64& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    c[i] = r % shape[i];
    r /= shape[i];
  }
  return c;
}

std::vector<int> expected_group(int rank, const Shape64& shape, const std::vector<size_t>& along) {
  int64_t world = 1;
  for (auto s : shape) world *= s;
  const auto mine = coords_of(rank, shape);
  std::map<int64_t, int> by_key;
  for (int r = 0; r < world; ++r) {
    const auto c = coords_of(r, shape);
    bool same = true;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (std::find(along.begin(), along.end(), i) == along.end() && c[i] != mine[i]) same = false;
    }
    if (!same) continue;
    int64_t key = 0;
    for (size_t i : along) key = key * shape[i] + c[i];
    by_key[key] = r;
  }
  std::vector<int> out;
  for (const auto& [k, r] : by_key) out.push_back(r);
  return out;
}

std::vector<std::string> dim_names(size_t n) {
  const std::vector<std::string> all = {"pp", "dp", "cp", "tp"};
  return std::vector<std::string>(all.end() - static_cast<long>(n), all.end());
}

struct MeshCase {
  int world;
  Shape64 shape;
};

class DeviceMeshSweep : public ::testing::TestWithParam<MeshCase> {};

TEST_P(DeviceMeshSweep, GroupsSumsFlattenAndCaching) {
  const auto [world, shape] = GetParam();
  const auto names = dim_names(shape.size());
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    auto world_group = pg.shared_from_this();
    DeviceMesh mesh = init_device_mesh(world_group, shape, names);
    ASSERT_EQ(mesh.coordinate(), coords_of(pg.rank(), shape));
    for (size_t d = 0; d < shape.size(); ++d) {
      auto g = mesh.group(names[d]);
      const auto expected = expected_group(pg.rank(), shape, {d});
      ASSERT_EQ(g->global_ranks(), expected) << mesh.str() << " dim " << names[d];
      ASSERT_EQ(mesh.local_rank(names[d]), coords_of(pg.rank(), shape)[d]);
      ASSERT_EQ(mesh[names[d]].ranks(), expected);
      // all_reduce over the dimension: the sum of the members' world ranks.
      Tensor t = from_vector<int64_t>({pg.rank(), 1});
      g->all_reduce(t);
      int64_t sum = 0;
      for (int r : expected) sum += r;
      ASSERT_EQ(t.data<int64_t>()[0], sum);
      ASSERT_EQ(t.data<int64_t>()[1], static_cast<int64_t>(expected.size()));
    }
    const int64_t made = mesh.splits_made();
    ASSERT_EQ(made, static_cast<int64_t>(shape.size()));
    // Slicing and re-asking create nothing new.
    for (size_t d = 0; d < shape.size(); ++d) {
      mesh.slice({names[d]}).group();
      mesh[names[d]].group(names[d]);
    }
    ASSERT_EQ(mesh.splits_made(), made);
    // Flatten everything: the whole world. That is a new layout (one new split) unless at most
    // one dimension has more than one rank, in which case it equals that dimension's group.
    const auto nontrivial =
        std::count_if(shape.begin(), shape.end(), [](int64_t s) { return s > 1; });
    const int64_t flatten_splits = nontrivial >= 2 ? 1 : 0;
    DeviceMesh flat = mesh.flatten(names, "world");
    std::vector<int> everyone(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) everyone[static_cast<size_t>(r)] = r;
    ASSERT_EQ(flat.group("world")->global_ranks(), everyone);
    ASSERT_EQ(mesh.splits_made(), made + flatten_splits);
    // Unflatten back: the same layouts, so the cached groups come back and nothing is split.
    DeviceMesh back = flat.unflatten("world", shape, names);
    for (size_t d = 0; d < shape.size(); ++d) {
      ASSERT_EQ(back.group(names[d]), mesh.group(names[d]));
    }
    ASSERT_EQ(mesh.splits_made(), made + flatten_splits);
    // Flatten of the first and last dims (not adjacent when ndim > 2).
    if (shape.size() >= 2) {
      DeviceMesh fl = mesh.flatten({names.front(), names.back()}, "fl");
      ASSERT_EQ(fl.group("fl")->global_ranks(),
                expected_group(pg.rank(), shape, {0, shape.size() - 1}));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceMeshSweep,
                         ::testing::Values(MeshCase{1, {1}}, MeshCase{2, {2}}, MeshCase{2, {1, 2}},
                                           MeshCase{4, {2, 2}}, MeshCase{4, {4, 1}},
                                           MeshCase{6, {2, 3}}, MeshCase{6, {3, 2}},
                                           MeshCase{8, {2, 4}}, MeshCase{8, {2, 2, 2}},
                                           MeshCase{12, {3, 4}}, MeshCase{12, {2, 3, 2}},
                                           MeshCase{16, {2, 2, 2, 2}}, MeshCase{16, {4, 1, 2, 2}}),
                         [](const ::testing::TestParamInfo<MeshCase>& info) {
                           std::string name = "world" + std::to_string(info.param.world) + "_shape";
                           for (int64_t s : info.param.shape) name += "_" + std::to_string(s);
                           return name;
                         });

TEST(DeviceMeshTest, JoinPutsViewsBackTogetherWithTheirGroups) {
  threads::run_ranks(8, [](ProcessGroup& pg) {
    DeviceMesh mesh =
        init_device_mesh(pg.shared_from_this(), {2, 2, 2}, {"dp_replicate", "dp_shard", "tp"});
    const DeviceMesh joined = mesh["dp_shard"].join(mesh["tp"]);
    EXPECT_EQ(joined, mesh.slice({"dp_shard", "tp"}));
    EXPECT_EQ(joined.coordinate(),
              (std::vector<int64_t>{mesh.local_rank("dp_shard"), mesh.local_rank("tp")}));
    EXPECT_EQ(joined.ranks(), mesh.slice({"dp_shard", "tp"}).ranks());
    const int64_t splits = mesh.splits_made();
    joined.group("tp");  // the family's group cache: tp's group, made once
    mesh.group("tp");
    EXPECT_EQ(mesh.splits_made(), splits + 1);
    const DeviceMesh three = mesh.slice({"dp_replicate", "dp_shard"}).join(mesh["tp"]);
    EXPECT_EQ(three, mesh);
    EXPECT_EQ(three.group("dp_replicate")->size(), 2);
    DeviceMesh other = init_device_mesh(pg.shared_from_this(), {8}, {"cp"});
    try {
      mesh["tp"].join(other);
      ADD_FAILURE() << "joined meshes of two families";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("different families"), std::string::npos) << e.what();
    }
  });
}

TEST(DeviceMeshTest, PrintsShapeDimsAndCoordinate) {
  threads::run_ranks(8, [](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 4}, {"dp", "tp"});
    if (pg.rank() == 5) {
      EXPECT_EQ(mesh.str(), "DeviceMesh(shape=(2, 4), dims=(dp, tp), rank 5 at (1, 1))");
      EXPECT_EQ(mesh["tp"].str(), "DeviceMesh(shape=(4), dims=(tp), rank 5 at (1))");
    }
  });
}

TEST(DeviceMeshTest, EagerCreatesEveryDimAndCanReleaseTheWorld) {
  threads::run_ranks(4, [](ProcessGroup& pg) {
    DeviceMeshOptions options;
    options.eager = true;
    options.release_world = true;
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"}, options);
    EXPECT_EQ(mesh.splits_made(), 2);
    EXPECT_EQ(mesh.group("dp")->size(), 2);
    // A new layout needs the world, which was released: a clear error, not a hang.
    EXPECT_THROW(mesh.flatten({"dp", "tp"}, "all").group("all"), InvalidArgument);
  });
}

// Invalid meshes fail on every rank with the same message, before any communication.
TEST(DeviceMeshTest, BadMeshesFailEverywhereWithTheSameMessage) {
  std::mutex mutex;
  std::map<std::string, std::set<std::string>> messages;  // case -> distinct messages
  std::atomic<int> failures{0};
  auto expect_error = [&](const std::string& name, const std::function<void()>& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      failures++;
      std::lock_guard lock(mutex);
      messages[name].insert(e.message());
    }
  };
  threads::run_ranks(8, [&](ProcessGroup& pg) {
    auto w = pg.shared_from_this();
    expect_error("size", [&] { init_device_mesh(w, {3, 4}, {"dp", "tp"}); });
    expect_error("unknown", [&] { init_device_mesh(w, {2, 4}, {"dp", "tp"})["pp"]; });
    expect_error("duplicate", [&] { init_device_mesh(w, {2, 4}, {"dp", "dp"}); });
    expect_error("slice", [&] { init_device_mesh(w, {2, 4}, {"dp", "tp"}).slice({"tp", "tp"}); });
    expect_error("count", [&] { init_device_mesh(w, {2, 2, 2}, {"dp", "tp"}); });
  });
  EXPECT_EQ(failures.load(), 5 * 8);
  ASSERT_EQ(messages.size(), 5u);
  for (const auto& [name, texts] : messages) EXPECT_EQ(texts.size(), 1u) << name;
  EXPECT_EQ(*messages["size"].begin(), "mesh shape (3, 4) has 12 ranks but the world has 8");
  EXPECT_NE(messages["unknown"].begin()->find("no dimension 'pp'"), std::string::npos);
}

// parents["dp"] routes dp's split through another world: aborting that world breaks dp only.
TEST(DeviceMeshTest, PerDimensionParentIsTheOneSplit) {
  auto other = threads::create_world(4, {.name = "other"});
  threads::run_ranks(4, [&](ProcessGroup& pg) {
    auto mine = other[static_cast<size_t>(pg.rank())];
    DeviceMeshOptions options;
    options.parents["dp"] = mine;
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"}, options);
    mine->abort("the other world is gone");
    EXPECT_THROW(mesh.group("dp"), CommError);
    EXPECT_EQ(mesh.group("tp")->size(), 2);
  });
  auto small = threads::create_world(2);
  threads::run_ranks(4, [&](ProcessGroup& pg) {
    DeviceMeshOptions options;
    options.parents["dp"] = small[0];
    EXPECT_THROW(init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"}, options),
                 InvalidArgument);
  });
}

TEST(DeviceMeshTest, AbortFailsBlockedCallsAndDestroyIsBounded) {
  threads::run_ranks(4, [](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"});
    auto tp = mesh.group("tp");
    mesh.destroy(std::chrono::seconds(10));  // every rank arrives: clean
  });
  // Rank 3 never reaches destroy: the others fail within the timeout instead of hanging.
  std::atomic<int> timed_out{0};
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(10);
  EXPECT_ANY_THROW(threads::run_ranks(
      4,
      [&](ProcessGroup& pg) {
        DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {4}, {"w"});
        if (pg.rank() == 3) throw CommError("rank 3 leaves without destroying its mesh");
        try {
          mesh.destroy(std::chrono::milliseconds(300));
        } catch (const Error&) {
          timed_out++;
          throw;
        }
      },
      options));
  EXPECT_EQ(timed_out.load(), 3);
}

}  // namespace
}  // namespace tessel
