#pragma once
// DTensor: a global tensor that lives in pieces across a DeviceMesh — this rank's local tensor
// plus the DTensorSpec that says how the pieces fit (placements, shard order, global shape).
//
// A container and a redistribution engine, not an op-dispatch layer: computation runs on local
// tensors, and every communication is an explicit call (redistribute, full_tensor, or a
// collective placed by a parallel style). Every entry point is differentiable on the local
// tensor, with the dual placement in backward (tessel/parallel/dtensor/placement.h): the gradient
// of a Replicate tensor is taken to be Partial (each rank's contribution), of a Partial tensor
// Replicate, of Shard(d) Shard(d). Where every rank computes the same loss from a replicated
// value, say so with grad_placements = Replicate.
//
//   DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
//   DTensor w = distribute_tensor(full, mesh, {Shard(0), Replicate()});
//   DTensor r = w.redistribute({Replicate(), Shard(1)});      // collectives on dp, tp
//   Tensor all = w.full_tensor();                              // every rank: the global tensor
//   // DTensor(global f32[1024, 768], mesh (dp=2, tp=4), placements (Shard(0), Replicate()),
//   //         local f32[512, 768] at offset [512, 0])
//
// Collective rules: redistribute, full_tensor, distribute_tensor (with a source rank) and
// from_local with run_check are collectives over the mesh's groups: every rank of the mesh calls
// them in the same order with the same specs. Invalid specs fail on every rank with the same
// message before any communication. Thread-safety: a DTensor is a value (shared spec and local
// tensor handles); as Tensor.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/collectives/work.h"
#include "tessel/parallel/dtensor/dtensor_spec.h"

namespace tessel {

struct FromLocalOptions {
  // The global shape; empty: inferred from every rank's local shape (needs run_check).
  std::optional<Shape> global_shape;
  // Mesh dimensions in splitting order (see DTensorSpec); empty: the mesh's order.
  std::vector<int64_t> shard_order = {};
  // Exchange local shapes and dtypes across the mesh and check them against the global shape
  // and placements, naming the first rank that disagrees (a collective over the whole mesh).
  bool run_check = true;
  // The placements of the local tensor's gradient in backward; empty: the dual placements.
  std::vector<Placement> grad_placements = {};
};

struct RedistributeOptions {
  std::vector<int64_t> shard_order = {};  // of the result; empty: the mesh's order
  // The placements of the result's gradient in backward; empty: the dual placements.
  std::vector<Placement> grad_placements = {};
};

class DTensor;

// A redistribution in flight: result() is valid once work completes (wait() does both).
struct AsyncDTensor;

class DTensor {
 public:
  DTensor() = default;  // undefined
  // A DTensor of `local`, checked against `spec` on this rank only (shape and dtype).
  DTensor(Tensor local, DTensorSpec spec);

  // This rank's `local` as its piece of a global tensor laid out by `placements` on `mesh`.
  // Throws InvalidArgument (on every rank) for placements that do not fit the mesh or tensor,
  // and — with run_check — for local shapes or dtypes that disagree across ranks, naming the
  // first such rank and what it should hold.
  static DTensor from_local(const Tensor& local, const DeviceMesh& mesh,
                            std::vector<Placement> placements,
                            const FromLocalOptions& options = {});

  bool defined() const { return spec_ != nullptr; }
  const DTensorSpec& spec() const;
  const DeviceMesh& mesh() const { return spec().mesh(); }
  const std::vector<Placement>& placements() const { return spec().placements(); }
  const Shape& global_shape() const { return spec().global_shape(); }
  DType dtype() const { return spec().dtype(); }
  Device device() const { return local_.device(); }
  // This rank's box in the global tensor.
  Shape local_offset() const { return spec().local_offset(); }
  Shape local_shape() const { return local_.shape(); }

  // The local tensor. With grad_placements, its gradient in backward is taken to have those
  // placements (and is redistributed to the dual placements of this DTensor).
  const Tensor& to_local() const { return local_; }
  Tensor to_local(const std::vector<Placement>& grad_placements) const;

  // The same global tensor with other placements (and shard order). Collective; blocking.
  DTensor redistribute(const std::vector<Placement>& placements,
                       const RedistributeOptions& options = {}) const;
  // As redistribute, returning before the last step's collective completes (the steps before
  // it are waited for: a step needs its predecessor's data). Not differentiable.
  AsyncDTensor redistribute_async(const std::vector<Placement>& placements,
                                  const RedistributeOptions& options = {}) const;
  // The global tensor on every rank (redistribute to all-Replicate). Collective.
  Tensor full_tensor(const std::vector<Placement>& grad_placements = {}) const;

  // The gradient of the local tensor as a DTensor with the dual placements; undefined when the
  // local tensor has none.
  DTensor grad() const;

  // "DTensor(global f32[1024, 768], mesh (dp=2, tp=4), placements (Shard(0), Replicate()),
  //  local f32[512, 768] at offset [512, 0])".
  std::string str() const;

 private:
  std::shared_ptr<const DTensorSpec> spec_;
  Tensor local_;
};

struct AsyncDTensor {
  DTensor result;  // its local tensor holds the data once `work` completes
  Work work;
  DTensor wait() {
    work.wait();
    return result;
  }
};

struct DistributeOptions {
  // The rank (in the whole mesh, row-major) whose `full` holds the values, broadcast to all;
  // -1: every rank holds the same values and slices locally (no communication).
  int src_rank = -1;
  std::vector<int64_t> shard_order = {};
};

// Lays out `full` (the global tensor; every rank passes a tensor of the same shape and dtype)
// on `mesh` by `placements`: each rank keeps its piece (a copy). Partial placements put the
// value on index 0 of that mesh dimension (sum) or on every index (avg, max, min). Collective
// when src_rank >= 0 (a broadcast over the mesh, after a check that every rank passed the same
// shape and dtype). Differentiable in `full` (backward: the dual placements, gathered back).
DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh,
                          std::vector<Placement> placements, const DistributeOptions& options = {});

// Throws InvalidArgument naming both meshes unless a and b live on the same mesh; `op` names
// the operation in the message.
void check_same_mesh(const char* op, const DTensor& a, const DTensor& b);

// A sharded parameter (fully_shard, a tensor-parallel style) or any tensor with a DTensor spec
// attached (Tensor::shard_info) as a DTensor; throws InvalidArgument naming it when it is not one.
DTensor as_dtensor(const Tensor& t);
bool is_dtensor(const Tensor& t);

}  // namespace tessel
