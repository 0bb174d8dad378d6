#include "tests/mesh/mesh_check.h"

#include "tessel/base/error.h"
#include "tessel/mesh/device_mesh.h"

namespace tessel::testing {

void check_two_by_two_mesh(const std::shared_ptr<ProcessGroup>& world) {
  TESSEL_CHECK(world->size() == 4, InvalidArgument, "the 2x2 mesh check needs 4 ranks, not {}",
               world->size());
  DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
  const int r = world->rank();
  // Rank r = 2*dp + tp: its tp group is {2*dp, 2*dp+1}, its dp group {tp, tp+2}.
  const std::vector<int> tp_expected = {r / 2 * 2, r / 2 * 2 + 1};
  const std::vector<int> dp_expected = {r % 2, r % 2 + 2};
  auto tp = mesh.group("tp");
  auto dp = mesh.group("dp");
  TESSEL_CHECK(tp->global_ranks() == tp_expected, Internal, "rank {}: tp group is wrong", r);
  TESSEL_CHECK(dp->global_ranks() == dp_expected, Internal, "rank {}: dp group is wrong", r);
  TESSEL_CHECK(mesh.local_rank("tp") == r % 2 && mesh.local_rank("dp") == r / 2, Internal,
               "rank {}: local ranks ({}, {}) are wrong", r, mesh.local_rank("dp"),
               mesh.local_rank("tp"));
  Tensor t = from_vector<float>({static_cast<float>(r)});
  tp->all_reduce(t);
  TESSEL_CHECK(t.data<float>()[0] == tp_expected[0] + tp_expected[1], Internal,
               "rank {}: tp all_reduce gave {}", r, t.data<float>()[0]);
  Tensor u = from_vector<float>({static_cast<float>(r)});
  dp->all_reduce(u);
  TESSEL_CHECK(u.data<float>()[0] == dp_expected[0] + dp_expected[1], Internal,
               "rank {}: dp all_reduce gave {}", r, u.data<float>()[0]);
  auto all = mesh.flatten({"dp", "tp"}, "all").group("all");
  Tensor v = from_vector<float>({1.0f});
  all->all_reduce(v);
  TESSEL_CHECK(v.data<float>()[0] == 4.0f, Internal, "rank {}: flattened all_reduce gave {}", r,
               v.data<float>()[0]);
  TESSEL_CHECK(mesh.splits_made() == 3, Internal, "rank {}: {} splits, expected 3", r,
               mesh.splits_made());
  mesh.destroy(std::chrono::seconds(30));
}

}  // namespace tessel::testing
