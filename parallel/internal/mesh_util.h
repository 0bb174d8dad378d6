#pragma once
// Private: helpers over a DeviceMesh shared by DTensor and the parallel wrappers.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/mesh/device_mesh.h"

namespace tessel::internal {

// The group over every rank of `mesh`, in row-major mesh order.
std::shared_ptr<ProcessGroup> whole_mesh_group(const DeviceMesh& mesh);

// Mesh coordinate of row-major index `index` of a mesh of `shape`.
std::vector<int64_t> unravel(int64_t index, const std::vector<int64_t>& shape);

// "(1, 2)"; one element prints "(1,)".
std::string coord_str(const std::vector<int64_t>& coord);

}  // namespace tessel::internal
