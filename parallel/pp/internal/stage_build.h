#pragma once
// What the model-specific stage files (gpt_stage.cc, llama_stage.cc) share: a child module as
// the shared handle its parent's registry holds, and the building of one rank's stages from a
// model made on the meta device.

#include <memory>
#include <string_view>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/pp/stage_layout.h"
#include "tessel/tensor/device.h"

namespace tessel::pp::internal {

// The child `name` of `parent`; throws OutOfRange naming it when absent.
inline std::shared_ptr<nn::Module> shared_child(const nn::Module& parent, std::string_view name) {
  for (const auto& [child_name, child] : parent.children()) {
    if (child_name == name) return child;
  }
  parent.child(name);  // throws OutOfRange naming it
  return nullptr;
}

// The stages rank `rank` of `num_ranks` runs (stage s on rank s % num_ranks) of a Model with
// `num_blocks` blocks split by `layout`: the model is built on the meta device, each of this
// rank's stages (Stage(model, stage, first block, blocks, is first, is last)) gets memory on
// `device`, then init_weights() draws every parameter in the whole model's order, so the meta
// ones only advance the generator. `what` names the model in errors.
template <typename Stage, typename Model, typename Config>
std::vector<std::shared_ptr<Stage>> build_stages(const Config& config, int num_blocks,
                                                 const std::vector<int>& layout, int rank,
                                                 int num_ranks, Device device,
                                                 std::string_view what) {
  const int S = static_cast<int>(layout.size());
  TESSEL_CHECK(
      num_ranks >= 1 && S >= num_ranks && S % num_ranks == 0 && rank >= 0 && rank < num_ranks,
      InvalidArgument,
      "{} stages for rank {} of {}: the layout has {} stages; expected a positive "
      "multiple of the rank count and 0 <= rank < ranks",
      what, rank, num_ranks, S);
  check_layout(layout, num_blocks, S);
  std::shared_ptr<Model> model;
  {
    DefaultDeviceGuard meta(Device::meta());
    model = std::make_shared<Model>(config);
  }
  std::vector<std::shared_ptr<Stage>> stages;
  int first = 0;
  for (int s = 0; s < S; ++s) {
    const int blocks = layout[static_cast<size_t>(s)];
    if (s % num_ranks == rank) {
      stages.push_back(std::make_shared<Stage>(model, s, first, blocks, s == 0, s == S - 1));
      stages.back()->to_empty(device);
    }
    first += blocks;
  }
  model->init_weights();
  return stages;
}

}  // namespace tessel::pp::internal
