// sharded_state_dict and full_state_dict over parameters that may be DTensors. See state_dict.h.
#include "tessel/parallel/fsdp/state_dict.h"

#include "tessel/parallel/internal/mesh_util.h"
#include "tessel/parallel/internal/state_dict_shape.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {

std::vector<std::pair<std::string, DTensor>> sharded_state_dict(nn::Module& model,
                                                                const DeviceMesh& mesh) {
  std::vector<std::pair<std::string, DTensor>> out;
  const std::vector<Placement> replicated(static_cast<size_t>(mesh.ndim()), Replicate{});
  auto add = [&](const std::string& name, const Tensor& t) {
    if (is_dtensor(t)) {
      out.emplace_back(name, as_dtensor(t));
    } else {
      out.emplace_back(name, DTensor(t, DTensorSpec(mesh, replicated, t.shape(), t.dtype())));
    }
  };
  for (auto& [name, t] : model.named_parameters()) add(name, t);
  for (auto& [name, t] : model.named_buffers()) add(name, t);
  return out;
}

nn::StateDict full_state_dict(nn::Module& model, bool rank0_only) {
  nn::StateDict out;
  bool keep = true;  // rank 0 of every parameter's mesh (with tensor parallelism, of both)
  for (auto& [name, t] : model.named_parameters()) {
    if (is_dtensor(t)) {
      const DTensor d = as_dtensor(t);
      // A tensor-parallel piece of a view (fused sections) takes the module's shape again.
      const Tensor whole = detach(d.full_tensor());
      out.emplace(name, reshape(whole, internal::state_dict_shape(model, name, whole.shape())));
      keep = keep && (!rank0_only || internal::whole_mesh_group(d.mesh())->rank() == 0);
    } else {
      out.emplace(name, t);
    }
  }
  for (auto& [name, t] : model.named_buffers()) out.emplace(name, t);
  if (!keep) out.clear();
  return out;
}

}  // namespace tessel
