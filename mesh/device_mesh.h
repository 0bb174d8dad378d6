#pragma once
// DeviceMesh: an N-dimensional, named grid of the ranks of a world group, giving every rank the
// process group of each dimension.
//
//   auto world = init_process_group();                          // 8 ranks
//   DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
//   mesh.group("tp");            // this rank's 4-rank tensor-parallel group (made on first use)
//   mesh["tp"].local_rank();     // its index in that group
//   DeviceMesh dp_tp = mesh.flatten({"dp", "tp"}, "dp_tp");
//   // DeviceMesh(shape=(2, 4), dims=(dp, tp), rank 5 at (1, 1))
//
// Groups are made by ONE split of the world group per dimension (colour = the group's origin in
// the layout, key = the index along the dimension), never by one creation per sub-group, and are
// cached by the dimension's layout: slicing, re-slicing or flattening to a layout that exists
// makes nothing new. Creation is lazy (on the first group() of a dimension) unless
// DeviceMeshOptions::eager is set; like any collective, every rank of the world must ask for the
// same dimensions' groups in the same order.
//
// Thread-safety: a mesh and its views share one state (world group, group cache) guarded by a
// mutex; all methods are thread-safe. Ownership: views share the state; groups are shared with
// callers.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/collectives/process_group.h"
#include "tessel/mesh/layout.h"
#include "tessel/tensor/device.h"

namespace tessel {

struct DeviceMeshOptions {
  bool eager = false;  // make every dimension's group at construction
  // Per-dimension timeout for the groups made along it (0 or absent: the world's default).
  std::map<std::string, Nanoseconds> timeouts = {};
  // Per-dimension parent group to split instead of the world (e.g. a world on another backend:
  // gloo for "dp", nccl for "tp"). Each must have the world's size and rank order.
  std::map<std::string, std::shared_ptr<ProcessGroup>> parents = {};
  // Drop the mesh's reference to the world group once eager creation is done (for NCCL this
  // frees a communicator nobody uses). Ignored unless eager.
  bool release_world = false;
  // init_device_mesh(Device::cuda(...), ...) makes its groups eagerly and drops the world group,
  // so no NCCL communicator is kept that nothing uses; set keep_world to keep it (and to make
  // groups lazily).
  bool keep_world = false;
};

class DeviceMesh {
 public:
  // Validates `shape`/`names` against the world on every rank before any communication, so a bad
  // mesh fails everywhere with the same message, e.g. "mesh shape (3, 4) has 12 ranks but the
  // world has 8". Collective only when options.eager.
  DeviceMesh(std::shared_ptr<ProcessGroup> world, const std::vector<int64_t>& shape,
             const std::vector<std::string>& names, DeviceMeshOptions options = {});

  int64_t ndim() const { return layout_.ndim(); }
  std::vector<int64_t> shape() const { return layout_.shape(); }
  std::vector<std::string> dim_names() const { return layout_.names(); }
  const MeshLayout& layout() const { return layout_; }
  int64_t size() const;                        // ranks in this (sub-)mesh
  int64_t size(const std::string& dim) const;  // ranks along one dimension
  // This rank's index along each dimension / along one dimension.
  std::vector<int64_t> coordinate() const;
  int64_t local_rank(const std::string& dim) const;
  int64_t local_rank() const;  // 1-D meshes only
  // World ranks of this (sub-)mesh, row-major over its dimensions.
  std::vector<int> ranks() const;

  // Views: share the state and the group cache; no communication.
  DeviceMesh operator[](const std::string& dim) const { return slice({dim}); }
  DeviceMesh slice(const std::vector<std::string>& dims) const;
  DeviceMesh flatten(const std::vector<std::string>& dims, const std::string& name) const;
  DeviceMesh unflatten(const std::string& dim, const std::vector<int64_t>& sizes,
                       const std::vector<std::string>& names) const;
  // This mesh's dimensions followed by `other`'s, as one mesh: views of one family joined back
  // together (mesh["dp"].join(mesh["tp"]) is mesh.slice({"dp", "tp"})) — how FSDP records a
  // tensor-parallel parameter's placements over (dp, tp). Throws InvalidArgument when `other`
  // belongs to another family, when a dimension name appears in both, or when the dimensions
  // overlap (see MeshLayout::join).
  DeviceMesh join(const DeviceMesh& other) const;

  // The group along `dim` (made by one split of the parent on first use: collective over the
  // whole world). The 1-D overload is for meshes of one dimension.
  std::shared_ptr<ProcessGroup> group(const std::string& dim) const;
  std::shared_ptr<ProcessGroup> group() const;
  // Every dimension's group, in dimension order (collective on first use).
  std::vector<std::shared_ptr<ProcessGroup>> groups() const;

  // Communicator splits this mesh family has made so far (for tests and benchmarks).
  int64_t splits_made() const;

  // Aborts every group of the mesh family and the world: pending and future calls fail with
  // CommError(reason). Never blocks on a peer. The groups go down together
  // (ProcessGroup::abort_together): NCCL aborts all their communicators in one
  // ncclGroupStart/ncclGroupEnd.
  void abort(const std::string& reason) const;
  // Orderly shutdown: a world barrier bounded by `timeout`, then the groups are released. When
  // the barrier fails (a peer died or hangs), everything is aborted and the error rethrown —
  // destroy() never hangs.
  void destroy(Nanoseconds timeout = std::chrono::seconds(30)) const;

  // "DeviceMesh(shape=(2, 4), dims=(dp, tp), rank 5 at (1, 1))"
  std::string str() const;
  // "(dp=2, tp=4)"
  std::string shape_str() const { return layout_.str(); }

  // The same mesh: one family (the same world and group cache) and the same dimensions over the
  // same ranks. Views of one family with other dimensions compare unequal.
  bool operator==(const DeviceMesh& other) const {
    return state_ == other.state_ && layout_.dims() == other.layout_.dims();
  }
  // Identifies the mesh family (for caches keyed by mesh; pair it with shape_str()).
  const void* family_id() const { return state_.get(); }

 private:
  struct State;
  DeviceMesh(std::shared_ptr<State> state, MeshLayout layout);

  std::shared_ptr<State> state_;
  MeshLayout layout_;
};

// A mesh over `world` (see DeviceMesh's constructor).
DeviceMesh init_device_mesh(std::shared_ptr<ProcessGroup> world, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& names, DeviceMeshOptions options = {});
// A mesh over the job's world group made by init_process_group() for `device` (CPU: gloo, or
// mpi under mpirun; CUDA: nccl, with eager groups and the world released unless
// options.keep_world).
DeviceMesh init_device_mesh(Device device, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& names, DeviceMeshOptions options = {});

}  // namespace tessel
