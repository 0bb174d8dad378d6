#pragma once
// DTensorSpec: how a global tensor lies on a DeviceMesh — placements (one per mesh dimension),
// the order in which mesh dimensions split a tensor dimension, global shape and dtype — and the
// exact arithmetic of every rank's shard: offsets and sizes for uneven and empty shards alike.
//
// Shards follow torch.chunk: a span of n split k ways gives pieces of ceil(n / k), the last
// ones smaller or empty (n = 5, k = 4: 2, 2, 1, 0). When several mesh dimensions shard one
// tensor dimension, the first in `shard_order` splits the whole span, the next splits each piece,
// and so on; the default order is the mesh's (dp before tp). Tensor parallelism followed by FSDP
// on the same tensor dimension declares order {tp, dp}: tp's pieces are split again by dp.
//
// Thread-safety: a value type; const methods are pure.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessel/mesh/device_mesh.h"
#include "tessel/parallel/dtensor/placement.h"
#include "tessel/tensor/tensor.h"

namespace tessel {

// Piece `index` of `parts` of a span of `size` (torch.chunk's sizes): {offset, length}.
inline std::pair<int64_t, int64_t> chunk_of(int64_t size, int64_t parts, int64_t index) {
  const int64_t chunk = (size + parts - 1) / parts;
  const int64_t offset = std::min(index * chunk, size);
  return {offset, std::min(chunk, size - offset)};
}

class DTensorSpec {
 public:
  // Validates (see validate()). shard_order empty: the mesh's dimension order.
  DTensorSpec(DeviceMesh mesh, std::vector<Placement> placements, Shape global_shape, DType dtype,
              std::vector<int64_t> shard_order = {});

  const DeviceMesh& mesh() const { return mesh_; }
  const std::vector<Placement>& placements() const { return placements_; }
  const Shape& global_shape() const { return global_shape_; }
  DType dtype() const { return dtype_; }
  // Mesh dimensions in splitting order, outermost first (always a full permutation).
  const std::vector<int64_t>& shard_order() const { return shard_order_; }

  // For each tensor dimension, the mesh dimensions that shard it, outermost first.
  std::vector<std::vector<int64_t>> shard_chains() const;
  // The box (offset, size per tensor dimension) held by the rank at mesh `coordinate`.
  std::pair<Shape, Shape> region(const std::vector<int64_t>& coordinate) const;
  // This rank's box.
  Shape local_offset() const { return region(mesh_.coordinate()).first; }
  Shape local_shape() const { return region(mesh_.coordinate()).second; }

  // The same layout with other placements (and the default order unless given).
  DTensorSpec with_placements(std::vector<Placement> placements,
                              std::vector<int64_t> shard_order = {}) const;

  // "global f32[1024, 768], mesh (dp=2, tp=4), placements (Shard(0), Replicate())".
  std::string str() const;

 private:
  // Throws InvalidArgument naming the problem: one placement per mesh dimension, Shard dims
  // within the tensor's rank (negative dims count from the end and are normalised), Partial ops
  // that do not mix max/min with others, shard_order a permutation of the mesh dimensions.
  void validate_and_normalise();

  DeviceMesh mesh_;
  std::vector<Placement> placements_;
  Shape global_shape_;
  DType dtype_;
  std::vector<int64_t> shard_order_;
};

// The box of tensor dimension `d` of size `size` after the splits of `chain` (mesh dimensions
// outermost first) at mesh `coordinate` of a mesh of `mesh_shape`: {offset, length}.
std::pair<int64_t, int64_t> chain_region(int64_t size, const std::vector<int64_t>& chain,
                                         const std::vector<int64_t>& mesh_shape,
                                         const std::vector<int64_t>& coordinate);

// "f32[1024, 768]".
std::string typed_shape_str(DType dtype, const Shape& shape);

}  // namespace tessel
