#include "tessel/mesh/layout.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "tessel/base/error.h"

namespace tessel {
namespace {

// Independent model: rank r of a row-major mesh has coordinate digits of r in mixed radix.
std::vector<int64_t> coords_of(int64_t rank, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    c[i] = rank % shape[i];
    rank /= shape[i];
  }
  return c;
}

// Groups along the dims `along` (indices into shape), each as a list ordered row-major over
// `along` in the given order: the ranks that agree on every other coordinate.
std::set<std::vector<int64_t>> expected_groups(const std::vector<int64_t>& shape,
                                               const std::vector<size_t>& along) {
  int64_t world = 1;
  for (auto s : shape) world *= s;
  std::map<std::vector<int64_t>, std::map<int64_t, int64_t>> groups;  // others -> key -> rank
  for (int64_t r = 0; r < world; ++r) {
    const auto c = coords_of(r, shape);
    std::vector<int64_t> others;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (std::find(along.begin(), along.end(), i) == along.end()) others.push_back(c[i]);
    }
    int64_t key = 0;
    for (size_t i : along) key = key * shape[i] + c[i];
    groups[others][key] = r;
  }
  std::set<std::vector<int64_t>> out;
  for (const auto& [others, members] : groups) {
    std::vector<int64_t> ranks;
    for (const auto& [key, rank] : members) ranks.push_back(rank);
    out.insert(ranks);
  }
  return out;
}

// Groups as the layout computes them: colour -> (key -> offset) over every root offset.
std::set<std::vector<int64_t>> layout_groups(const MeshDim& dim, int64_t world) {
  std::map<int64_t, std::map<int64_t, int64_t>> groups;
  for (int64_t r = 0; r < world; ++r) {
    const auto m = MeshLayout::membership(dim, r);
    EXPECT_TRUE(groups[m.color].emplace(m.key, r).second) << "two ranks share a key";
  }
  std::set<std::vector<int64_t>> out;
  for (const auto& [color, members] : groups) {
    std::vector<int64_t> ranks;
    for (const auto& [key, rank] : members) ranks.push_back(rank);
    out.insert(ranks);
    // The dimension's own offsets, placed at the group's origin, give the same members.
    std::vector<int64_t> from_offsets;
    for (int64_t o : dim.offsets()) from_offsets.push_back(color + o);
    EXPECT_EQ(ranks, from_offsets);
  }
  return out;
}

// The message of the InvalidArgument `f` throws, or "no error".
template <typename F>
std::string message(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return std::string("no error");
}

struct Case {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
};

class MeshLayoutSweep : public ::testing::TestWithParam<Case> {};

TEST_P(MeshLayoutSweep, EveryDimGroupsMatchTheModel) {
  const auto& [shape, names] = GetParam();
  const MeshLayout layout = MeshLayout::row_major(shape, names);
  for (size_t d = 0; d < shape.size(); ++d) {
    EXPECT_EQ(layout_groups(layout.dims()[d], layout.root_size()), expected_groups(shape, {d}))
        << "dim " << names[d] << " of " << layout.str();
  }
}

TEST_P(MeshLayoutSweep, FlattenAnyPairMatchesTheModel) {
  const auto& [shape, names] = GetParam();
  const MeshLayout layout = MeshLayout::row_major(shape, names);
  for (size_t a = 0; a < shape.size(); ++a) {
    for (size_t b = 0; b < shape.size(); ++b) {
      if (a == b) continue;
      const MeshLayout flat = layout.flatten({names[a], names[b]}, "f");
      EXPECT_EQ(flat.ndim(), layout.ndim() - 1);
      EXPECT_EQ(layout_groups(flat.dim("f"), layout.root_size()), expected_groups(shape, {a, b}))
          << "flatten(" << names[a] << ", " << names[b] << ")";
    }
  }
}

TEST_P(MeshLayoutSweep, CoordinatesRoundTrip) {
  const auto& [shape, names] = GetParam();
  const MeshLayout layout = MeshLayout::row_major(shape, names);
  for (int64_t r = 0; r < layout.root_size(); ++r) {
    EXPECT_EQ(layout.coordinate(r, 0), coords_of(r, shape));
    EXPECT_EQ(layout.origin_of(r), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MeshLayoutSweep,
                         ::testing::Values(Case{{1}, {"w"}}, Case{{6}, {"w"}},
                                           Case{{2, 4}, {"dp", "tp"}}, Case{{3, 4}, {"dp", "tp"}},
                                           Case{{2, 3, 2}, {"pp", "dp", "tp"}},
                                           Case{{2, 1, 3, 2}, {"pp", "dp", "cp", "tp"}},
                                           Case{{4, 1}, {"dp", "tp"}}));

TEST(MeshLayoutTest, SliceKeepsRootOffsets) {
  const MeshLayout layout = MeshLayout::row_major({2, 3, 4}, {"pp", "dp", "tp"});
  const MeshLayout sub = layout.slice({"tp", "pp"});
  EXPECT_EQ(sub.names(), (std::vector<std::string>{"tp", "pp"}));
  EXPECT_EQ(sub.shape(), (std::vector<int64_t>{4, 2}));
  // Rank 17 = (pp 1, dp 1, tp 1): its (tp, pp) sub-mesh has origin 4 (dp 1, others 0).
  EXPECT_EQ(sub.origin_of(17), 4);
  EXPECT_EQ(sub.coordinate(17, 4), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(sub.coordinate(17, 0), std::nullopt);
}

TEST(MeshLayoutTest, UnflattenWorld) {
  const MeshLayout world = MeshLayout::row_major({8}, {"world"});
  const MeshLayout mesh = world.unflatten("world", {2, 4}, {"dp", "tp"});
  const MeshLayout direct = MeshLayout::row_major({2, 4}, {"dp", "tp"});
  EXPECT_EQ(mesh.dims(), direct.dims());
  // And back: flattening gives the world's canonical layout.
  EXPECT_EQ(mesh.flatten({"dp", "tp"}, "world").dim("world").canonical_modes(),
            world.dim("world").canonical_modes());
}

TEST(MeshLayoutTest, UnflattenAFlattenedNonAdjacentDim) {
  const std::vector<int64_t> shape = {2, 3, 2};
  const MeshLayout layout = MeshLayout::row_major(shape, {"a", "b", "c"});
  const MeshLayout round = layout.flatten({"a", "c"}, "ac").unflatten("ac", {2, 2}, {"x", "y"});
  EXPECT_EQ(layout_groups(round.dim("x"), 12), expected_groups(shape, {0}));
  EXPECT_EQ(layout_groups(round.dim("y"), 12), expected_groups(shape, {2}));
}

TEST(MeshLayoutTest, CanonicalModesIdentifySameGroups) {
  const MeshLayout layout = MeshLayout::row_major({2, 1, 4}, {"dp", "cp", "tp"});
  EXPECT_EQ(layout.flatten({"dp", "cp", "tp"}, "all").dim("all").canonical_modes(),
            (std::vector<MeshMode>{{8, 1}}));
  EXPECT_NE(layout.flatten({"tp", "dp"}, "x").dim("x").canonical_modes(),
            layout.flatten({"dp", "tp"}, "x").dim("x").canonical_modes());
}

TEST(MeshLayoutTest, JoinOfSlicesIsTheSliceOfBoth) {
  const MeshLayout mesh = MeshLayout::row_major({2, 3, 2}, {"dp_replicate", "dp_shard", "tp"});
  EXPECT_EQ(mesh.slice({"dp_shard"}).join(mesh.slice({"tp"})).dims(),
            mesh.slice({"dp_shard", "tp"}).dims());
  EXPECT_EQ(mesh.slice({"dp_replicate", "dp_shard"}).join(mesh.slice({"tp"})).dims(), mesh.dims());
  // Any order and non-adjacent dimensions: tp before dp_replicate.
  const MeshLayout odd = mesh.slice({"tp"}).join(mesh.slice({"dp_replicate"}));
  EXPECT_EQ(odd.names(), (std::vector<std::string>{"tp", "dp_replicate"}));
  EXPECT_EQ(layout_groups(odd.dims()[1], 12), expected_groups({2, 3, 2}, {0}));
  // A flattened dimension joins with what it does not contain.
  const MeshLayout dp = mesh.flatten({"dp_replicate", "dp_shard"}, "dp");
  EXPECT_EQ(dp.slice({"dp"}).join(mesh.slice({"tp"})).shape(), (std::vector<int64_t>{6, 2}));
}

TEST(MeshLayoutTest, JoinRefusesSharedNamesOverlapAndOtherRoots) {
  const MeshLayout mesh = MeshLayout::row_major({2, 4}, {"dp", "tp"});
  EXPECT_NE(message([&] {
              mesh.slice({"tp"}).join(mesh.slice({"tp"}));
            }).find("both have a dimension 'tp'"),
            std::string::npos);
  const MeshLayout flat = mesh.flatten({"dp", "tp"}, "world");
  EXPECT_NE(message([&] { flat.join(mesh.slice({"tp"})); }).find("the dimensions overlap"),
            std::string::npos);
  // Same size, overlapping digits: tp's low half twice.
  const MeshLayout split = mesh.unflatten("tp", {2, 2}, {"hi", "lo"});
  const MeshLayout lo_again =
      MeshLayout::row_major({2, 4}, {"a", "b"}).unflatten("b", {2, 2}, {"x", "lo2"});
  EXPECT_NE(message([&] {
              split.slice({"lo"}).join(lo_again.slice({"lo2"}));
            }).find("the dimensions overlap"),
            std::string::npos);
  EXPECT_NE(message([&] { mesh.join(MeshLayout::row_major({4}, {"cp"})); }).find("different roots"),
            std::string::npos);
}

TEST(MeshLayoutTest, BadInputNamesTheProblem) {
  EXPECT_NE(message([] {
              MeshLayout::row_major({2, 4}, {"dp"});
            }).find("2 dimensions but 1"),
            std::string::npos);
  EXPECT_NE(message([] {
              MeshLayout::row_major({2, 4}, {"dp", "dp"});
            }).find("'dp' appears twice"),
            std::string::npos);
  EXPECT_NE(message([] {
              MeshLayout::row_major({2, 0}, {"dp", "tp"});
            }).find("size 0"),
            std::string::npos);
  const MeshLayout layout = MeshLayout::row_major({2, 4}, {"dp", "tp"});
  EXPECT_NE(
      message([&] { layout.slice({"pp"}); }).find("no dimension 'pp'; its dimensions are (dp, tp)"),
      std::string::npos);
  EXPECT_NE(message([&] {
              layout.flatten({"dp", "tp"}, "dp");
            }).find("no error"),
            std::string::npos);  // replacing one of its own names is fine
  EXPECT_NE(message([&] {
              layout.unflatten("tp", {3, 2}, {"a", "b"});
            }).find("multiply to 6"),
            std::string::npos);
  const MeshLayout odd = MeshLayout::row_major({6}, {"w"});
  EXPECT_EQ(message([&] { odd.unflatten("w", {2, 3}, {"a", "b"}); }), "no error");
  const MeshLayout two = odd.unflatten("w", {2, 3}, {"a", "b"}).flatten({"b", "a"}, "ba");
  EXPECT_NE(message([&] {
              two.unflatten("ba", {2, 3}, {"x", "y"});
            }).find("does not divide"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel
