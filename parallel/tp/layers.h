#pragma once
// The tensor-parallel layers that parallelize_module puts in place of a Linear or an Embedding
// (through the module registry, set_submodule). Each takes over the original module's parameter
// tensors — the same tensors, re-laid-out in place (Tensor::set_data) to this rank's piece, so
// references held elsewhere (a tied LM head, an optimizer) stay valid — and attaches their
// DTensor spec on the tp mesh (Tensor::shard_info; see as_dtensor in dtensor.h). Parameter names
// are unchanged ("weight", "bias").
//
//   auto col = std::make_shared<ColumnParallelLinear>(linear, mesh["tp"], ColwiseParallel{});
//   model.set_submodule("h.0.mlp.c_fc", col);
//
// A parameter on the meta device stays there with its piece's shape (no copy); one with values
// keeps a copy of its piece. Construction makes no communication; forward and backward issue
// the collectives of their style on the tp group, the same on every rank (see regions.h).
// Thread-safety and ownership: as nn::Module.

#include <cstdint>
#include <memory>

#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/embedding.h"
#include "tessel/nn/linear.h"
#include "tessel/parallel/dtensor/dtensor_spec.h"
#include "tessel/parallel/tp/style.h"

namespace tessel {

// Weight (out, in) -> rows chunk_of(out, tp, rank), Shard(0); bias likewise. With sections S:
// weight (S, rows, in) and bias (S, rows), Shard(1) of the (S, out / S, in) view of the whole.
class ColumnParallelLinear : public nn::Module {
 public:
  // Throws InvalidArgument when sections do not divide the output features, for layouts the
  // style does not take, or when `tp_mesh` is not 1-D.
  ColumnParallelLinear(nn::Linear& linear, const DeviceMesh& tp_mesh, ColwiseParallel style);
  Tensor forward(const Tensor& x) override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }  // of the whole layer

 private:
  DeviceMesh mesh_;
  ColwiseParallel style_;
  int64_t in_features_, out_features_;
  Tensor* weight_;
  Tensor* bias_ = nullptr;
};

// Weight (out, in) -> columns chunk_of(in, tp, rank), Shard(1); bias whole on every rank
// (Replicate), added after the reduction.
class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(nn::Linear& linear, const DeviceMesh& tp_mesh, RowwiseParallel style);
  Tensor forward(const Tensor& x) override;

 private:
  DeviceMesh mesh_;
  RowwiseParallel style_;
  int64_t in_features_;
  Tensor* weight_;
  Tensor* bias_ = nullptr;
};

// Weight (V, D) -> rows chunk_of(V, tp, rank) (uneven vocabularies exact), Shard(0). Tokens
// outside [0, V) throw OutOfRange naming the first, on every rank (the tokens are replicated).
class VocabParallelEmbedding : public nn::Module {
 public:
  VocabParallelEmbedding(nn::Embedding& embedding, const DeviceMesh& tp_mesh,
                         RowwiseParallel style);
  Tensor forward(const Tensor& tokens) override;

  int64_t vocab_size() const { return vocab_size_; }
  // This rank's first vocabulary row and row count.
  int64_t vocab_start() const { return start_; }
  int64_t vocab_rows() const { return rows_; }

 private:
  DeviceMesh mesh_;
  RowwiseParallel style_;
  int64_t vocab_size_, start_, rows_;
  Tensor* weight_;
};

// The checks the constructors make, changing nothing (parallelize_module runs them for a whole
// plan first): layouts the style takes, sections that divide the output features. Throw
// InvalidArgument naming the problem.
void check_colwise(const nn::Linear& linear, const ColwiseParallel& style);
void check_rowwise(const nn::Linear& linear, const RowwiseParallel& style);
void check_rowwise(const nn::Embedding& embedding, const RowwiseParallel& style);

// Re-lays-out parameter `p` in place (Tensor::set_data) as this rank's piece of `spec` — whose
// global shape is p's or a view of it — and attaches the spec (Tensor::shard_info). Throws
// InvalidArgument when p is already a shard or its element count differs from the spec's.
void shard_parameter(const Tensor& p, const DTensorSpec& spec, const std::string& name);

}  // namespace tessel
