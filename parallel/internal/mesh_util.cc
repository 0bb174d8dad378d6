#include "tessel/parallel/internal/mesh_util.h"

#include <fmt/format.h>

namespace tessel::internal {

std::shared_ptr<ProcessGroup> whole_mesh_group(const DeviceMesh& mesh) {
  if (mesh.ndim() == 1) return mesh.group();
  return mesh.flatten(mesh.dim_names(), "__whole_mesh").group();
}

std::vector<int64_t> unravel(int64_t index, const std::vector<int64_t>& shape) {
  std::vector<int64_t> coord(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    coord[i] = index % shape[i];
    index /= shape[i];
  }
  return coord;
}

std::string coord_str(const std::vector<int64_t>& coord) {
  std::string out = "(";
  for (size_t i = 0; i < coord.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", coord[i]);
  return out + (coord.size() == 1 ? ",)" : ")");
}

}  // namespace tessel::internal
