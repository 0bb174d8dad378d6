// Expert parallelism applied to a model's MoE layers. See expert_parallel.h.
#include "tessel/parallel/ep/expert_parallel.h"

#include <algorithm>
#include <utility>

#include "tessel/base/error.h"
#include "tessel/parallel/dtensor/dtensor_spec.h"
#include "tessel/parallel/tp/layers.h"

namespace tessel {
namespace {

constexpr const char* kExpertWeights[] = {"gate_proj", "up_proj", "down_proj"};

std::vector<std::string> data_dims_of(const DeviceMesh& mesh, const ExpertParallelOptions& o) {
  if (!o.data_dims.empty()) return o.data_dims;
  std::vector<std::string> dims;
  for (const std::string& d : mesh.dim_names()) {
    if (d != "tp" && d != "pp") dims.push_back(d);
  }
  return dims;
}

}  // namespace

DeviceMesh carve_ep_mesh(const DeviceMesh& mesh, int64_t ep, const std::string& from) {
  TESSEL_CHECK(mesh.layout().has_dim(from), InvalidArgument,
               "expert parallelism: mesh {} has no dimension '{}' to carve ep from",
               mesh.shape_str(), from);
  const int64_t n = mesh.size(from);
  TESSEL_CHECK(ep >= 1 && n % ep == 0, InvalidArgument,
               "expert parallelism: ep = {} does not divide mesh dimension '{}' of {} ranks "
               "(mesh {})",
               ep, from, n, mesh.shape_str());
  return mesh.unflatten(from, {n / ep, ep}, {"efsdp", "ep"});
}

ExpertParallelStats ExpertParallel::stats() const {
  ExpertParallelStats total;
  for (const auto& d : dispatchers_) total += d->stats();
  return total;
}

void ExpertParallel::reset_stats() {
  for (const auto& d : dispatchers_) d->reset_stats();
}

ExpertParallel parallelize_experts(nn::Module& model, const DeviceMesh& mesh,
                                   const ExpertParallelOptions& options) {
  // Every check first: nothing changes and nothing is communicated until all pass.
  TESSEL_CHECK(mesh.layout().has_dim(options.ep_dim), InvalidArgument,
               "parallelize_experts: mesh {} has no dimension '{}'", mesh.shape_str(),
               options.ep_dim);
  const std::vector<std::string> data_dims = data_dims_of(mesh, options);
  for (const std::string& d : data_dims) {
    TESSEL_CHECK(mesh.layout().has_dim(d), InvalidArgument,
                 "parallelize_experts: mesh {} has no data dimension '{}'", mesh.shape_str(), d);
  }
  TESSEL_CHECK(std::find(data_dims.begin(), data_dims.end(), options.ep_dim) != data_dims.end(),
               InvalidArgument,
               "parallelize_experts: the ep dimension '{}' must be one of the data dimensions "
               "(ep ranks hold other tokens)",
               options.ep_dim);
  const int64_t ep = mesh.size(options.ep_dim);
  std::vector<std::pair<std::string, nn::MoE*>> layers;
  for (auto& [name, m] : model.named_modules()) {
    if (auto* moe = dynamic_cast<nn::MoE*>(m)) layers.emplace_back(name, moe);
  }
  TESSEL_CHECK(!layers.empty(), InvalidArgument,
               "parallelize_experts: the model has no MoE layer to shard over '{}'",
               options.ep_dim);
  for (const auto& [name, moe] : layers) {
    const nn::MoEOptions& o = moe->options();
    TESSEL_CHECK(o.num_experts % ep == 0, InvalidArgument,
                 "parallelize_experts: {} experts of layer '{}' do not divide over ep = {} "
                 "(mesh {})",
                 o.num_experts, name, ep, mesh.shape_str());
    TESSEL_CHECK(o.top_k >= 1 && o.top_k <= o.num_experts, InvalidArgument,
                 "parallelize_experts: top_k = {} of layer '{}' exceeds its {} experts", o.top_k,
                 name, o.num_experts);
    TESSEL_CHECK(o.capacity_factor == 0, InvalidArgument,
                 "parallelize_experts: layer '{}' has capacity_factor {}; expert parallelism is "
                 "dropless (set it to 0)",
                 name, o.capacity_factor);
    TESSEL_CHECK(moe->dispatcher() == nullptr, InvalidArgument,
                 "parallelize_experts: layer '{}' already has a dispatcher (apply expert "
                 "parallelism once)",
                 name);
    for (const char* w : kExpertWeights) {
      const Tensor& p = moe->child("experts").parameter(w);
      TESSEL_CHECK(p.shard_info() == nullptr, InvalidArgument,
                   "parallelize_experts: '{}.experts.{}' is already a shard ({}); apply expert "
                   "parallelism before fully_shard",
                   name, w, p.str());
    }
  }

  // Each expert weight becomes this rank's E / ep experts, Shard(0) on the ep mesh; the
  // dispatchers make their groups on the first forward (every rank, in the same order).
  const DeviceMesh ep_mesh = mesh[options.ep_dim];
  const DeviceMesh data_mesh =
      data_dims.size() == 1 ? mesh[data_dims[0]] : mesh.flatten(data_dims, "ep_data")["ep_data"];
  ExpertParallel out;
  out.ep_ = ep;
  for (const auto& [name, moe] : layers) {
    nn::Module& experts = moe->child("experts");
    for (const char* w : kExpertWeights) {
      const Tensor& p = experts.parameter(w);
      shard_parameter(p, DTensorSpec(ep_mesh, {Shard{0}}, p.shape(), p.dtype()),
                      name + ".experts." + w);
    }
    auto dispatcher =
        std::make_shared<AllToAllDispatcher>(moe->options().num_experts, ep_mesh, data_mesh);
    moe->set_dispatcher(dispatcher);
    out.layers_.push_back(moe);
    out.dispatchers_.push_back(std::move(dispatcher));
  }
  return out;
}

}  // namespace tessel
