#pragma once
// Private: parameters whose DTensor is a view of the module's own shape (ColwiseParallel's
// sections: (3, C, C) for GPT-2's (3C, C) c_attn weight). The layer records the shape a whole
// parameter has in the module; full_state_dict gives the parameter that shape.

#include <map>
#include <string>

#include "tessel/nn/module.h"

namespace tessel::internal {

// Attached to the owning module (Module::set_attachment) under kStateDictShapes.
inline constexpr char kStateDictShapes[] = "tessel.state_dict_shapes";
struct StateDictShapes {
  std::map<std::string, Shape> shapes;  // by the parameter's name within its module
};

// The shape `model`'s parameter `dotted_name` has in a full state dict: the one its module
// recorded, else `shape`.
Shape state_dict_shape(nn::Module& model, const std::string& dotted_name, const Shape& shape);

}  // namespace tessel::internal
