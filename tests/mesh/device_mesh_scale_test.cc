// Meshes over fake worlds of up to 65,536 ranks in one process: each sampled rank builds its own
// mesh on a fake group (no data moves) and its groups must hold exactly the ranks the coordinate
// model says, with one split per dimension.
#include <gtest/gtest.h>

#include <random>

#include "tessel/collectives/fake/fake_backend.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/mesh/device_mesh.h"

namespace tessel {
namespace {

struct ScaleCase {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
};

// Rank r's group along dims `along`: vary those digits of r, keep the others.
std::vector<int> model_group(int64_t r, const std::vector<int64_t>& shape,
                             const std::vector<size_t>& along) {
  std::vector<int64_t> digits(shape.size()), strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    digits[i] = (r / stride) % shape[i];
    stride *= shape[i];
  }
  int64_t base = r;
  for (size_t i : along) base -= digits[i] * strides[i];
  std::vector<int> out = {static_cast<int>(base)};
  for (size_t i : along) {  // row-major over `along`: later dims vary fastest
    std::vector<int> next;
    for (int b : out) {
      for (int64_t k = 0; k < shape[i]; ++k) next.push_back(static_cast<int>(b + k * strides[i]));
    }
    out = std::move(next);
  }
  return out;
}

class DeviceMeshScaleTest : public ::testing::TestWithParam<ScaleCase> {};

TEST_P(DeviceMeshScaleTest, SampledRanksGetExactGroupsWithOneSplitPerDim) {
  const auto& [shape, names] = GetParam();
  int64_t world = 1;
  for (auto s : shape) world *= s;
  std::vector<int64_t> sample = {0, 1, world / 2, world - 1};
  std::mt19937_64 rng(42);
  for (int i = 0; i < 12; ++i) sample.push_back(static_cast<int64_t>(rng() % world));
  fr::FlightRecorder::global().set_enabled(false);  // groups are many; the records do not matter
  for (int64_t r : sample) {
    auto pg = fake::create_process_group(static_cast<int>(r), static_cast<int>(world));
    DeviceMesh mesh = init_device_mesh(pg, shape, names);
    for (size_t d = 0; d < shape.size(); ++d) {
      ASSERT_EQ(mesh.group(names[d])->global_ranks(), model_group(r, shape, {d}))
          << "rank " << r << " dim " << names[d];
    }
    ASSERT_EQ(mesh.splits_made(), static_cast<int64_t>(shape.size()));
    // Flatten the first and last dimensions (not adjacent for 3-D meshes): one more split.
    DeviceMesh flat = mesh.flatten({names.front(), names.back()}, "outer");
    ASSERT_EQ(flat.group("outer")->global_ranks(), model_group(r, shape, {0, shape.size() - 1}));
    ASSERT_EQ(mesh.splits_made(), static_cast<int64_t>(shape.size()) + 1);
  }
  fr::FlightRecorder::global().set_enabled(true);
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceMeshScaleTest,
                         ::testing::Values(ScaleCase{{64, 8, 128}, {"dp", "pp", "tp"}},
                                           ScaleCase{{8192, 8}, {"dp", "tp"}},
                                           ScaleCase{{16, 4, 4, 8}, {"pp", "dp", "cp", "tp"}},
                                           ScaleCase{{3, 5, 7}, {"pp", "dp", "tp"}}),
                         [](const ::testing::TestParamInfo<ScaleCase>& info) {
                           std::string name = "shape";
                           for (int64_t s : info.param.shape) name += "_" + std::to_string(s);
                           return name;
                         });

}  // namespace
}  // namespace tessel
