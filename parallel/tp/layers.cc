// ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding: parameters re-laid-out in
// place, forward with the style's collectives. See layers.h.
#include "tessel/parallel/tp/layers.h"

#include <utility>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/parallel/internal/state_dict_shape.h"
#include "tessel/parallel/tp/regions.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

void check_tp_mesh(const DeviceMesh& mesh, const char* layer) {
  TESSEL_CHECK(mesh.ndim() == 1, InvalidArgument,
               "{} needs the 1-D tensor-parallel mesh (mesh[\"tp\"]), got {}", layer,
               mesh.shape_str());
}

// Takes `from`'s parameter `name` (the same tensor), lays it out in place as `placement` of
// the whole viewed as `view` (its own shape when empty), and registers it in `to` under the
// same name. Returns `to`'s slot.
Tensor* adopt_parameter(nn::Module& to, nn::Module& from, const std::string& name,
                        const DeviceMesh& mesh, Placement placement, Shape view = {}) {
  Tensor p = from.parameter(name);
  if (view.empty()) view = p.shape();
  shard_parameter(p, DTensorSpec(mesh, {placement}, std::move(view), p.dtype()), name);
  return &to.register_parameter(name, p, p.requires_grad());
}

// A partial sum over the group made whole: all_reduce to Replicate, reduce_scatter to Shard(d).
Tensor reduce_partial(const Tensor& y, const std::shared_ptr<ProcessGroup>& group,
                      const Placement& output) {
  return output.is_replicate() ? reduce_from_tp_region(y, group)
                               : reduce_scatter_to_sp_region(y, group, output.dim());
}

}  // namespace

void shard_parameter(const Tensor& p, const DTensorSpec& spec, const std::string& name) {
  TESSEL_CHECK(p.shard_info() == nullptr, InvalidArgument,
               "parallelize_module: parameter '{}' ({}) is already a shard (apply tensor "
               "parallelism once, before fully_shard)",
               name, p.str());
  const Shape& global = spec.global_shape();
  TESSEL_CHECK(shape_numel(global) == p.numel() && spec.dtype() == p.dtype(), InvalidArgument,
               "parallelize_module: parameter '{}' {} does not fit the layout {}", name, p.str(),
               spec.str());
  const auto [offset, shape] = spec.region(spec.mesh().coordinate());
  NoGradGuard no_grad;
  Tensor piece;
  if (p.is_meta()) {
    piece = empty(shape, p.dtype(), Device::meta());
  } else {
    piece = reshape(detach(p), global);
    for (size_t d = 0; d < global.size(); ++d) {
      if (shape[d] != global[d])
        piece = narrow(piece, static_cast<int64_t>(d), offset[d], shape[d]);
    }
    piece = clone(piece);
  }
  p.set_data(piece);
  p.set_shard_info(std::make_shared<ShardInfo>(
      ShardInfo{global, offset, std::make_shared<const DTensorSpec>(spec)}));
}

void check_colwise(const nn::Linear& linear, const ColwiseParallel& style) {
  const int64_t out = linear.weight().size(0);
  const int64_t s = style.sections;
  TESSEL_CHECK(s >= 1 && out % s == 0, InvalidArgument,
               "ColwiseParallel: {} sections do not divide the {} output features", s, out);
  TESSEL_CHECK(style.input_layout.is_replicate() || style.input_layout.is_shard(), InvalidArgument,
               "ColwiseParallel takes a Replicate() or Shard(d) input layout, got {}",
               style.input_layout.str());
  TESSEL_CHECK(style.output_layout.is_shard(-1) || style.output_layout.is_replicate(),
               InvalidArgument,
               "ColwiseParallel gives a Shard(-1) or Replicate() output layout, got {}",
               style.output_layout.str());
  TESSEL_CHECK(s == 1 || !style.output_layout.is_replicate(), InvalidArgument,
               "ColwiseParallel with {} sections keeps its output features split "
               "(output_layout Shard(-1)); a Replicate() output would interleave the sections",
               s);
  TESSEL_CHECK(style.overlap_chunks == 0 || style.input_layout.is_shard(), InvalidArgument,
               "ColwiseParallel: overlap_chunks {} needs a Shard(d) input layout (the all_gather "
               "it splits), got {}",
               style.overlap_chunks, style.input_layout.str());
}

void check_rowwise(const nn::Linear&, const RowwiseParallel& style) {
  const Placement in = style.input_layout.value_or(Shard{-1});
  TESSEL_CHECK(in.is_shard(-1) || in.is_replicate(), InvalidArgument,
               "RowwiseParallel on a Linear takes a Shard(-1) or Replicate() input layout, got {}",
               in.str());
  TESSEL_CHECK(style.output_layout.is_replicate() || style.output_layout.is_shard(),
               InvalidArgument,
               "RowwiseParallel gives a Replicate() or Shard(d) output layout, got {}",
               style.output_layout.str());
}

void check_rowwise(const nn::Embedding&, const RowwiseParallel& style) {
  const Placement in = style.input_layout.value_or(Replicate{});
  TESSEL_CHECK(in.is_replicate(), InvalidArgument,
               "RowwiseParallel on an Embedding takes Replicate() tokens, got input layout {}",
               in.str());
  TESSEL_CHECK(style.output_layout.is_replicate() || style.output_layout.is_shard(),
               InvalidArgument,
               "RowwiseParallel gives a Replicate() or Shard(d) output layout, got {}",
               style.output_layout.str());
}

// ---- ColumnParallelLinear ----------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(nn::Linear& linear, const DeviceMesh& tp_mesh,
                                           ColwiseParallel style)
    : Module("ColumnParallelLinear"), mesh_(tp_mesh), style_(style) {
  check_tp_mesh(tp_mesh, "ColumnParallelLinear");
  out_features_ = linear.weight().size(0);
  in_features_ = linear.weight().size(1);
  check_colwise(linear, style_);
  const int64_t s = style_.sections;
  if (s == 1) {
    weight_ = adopt_parameter(*this, linear, "weight", mesh_, Shard{0});
    if (linear.bias().defined()) bias_ = adopt_parameter(*this, linear, "bias", mesh_, Shard{0});
  } else {
    auto recorded = std::make_shared<internal::StateDictShapes>();
    recorded->shapes["weight"] = linear.weight().shape();
    weight_ = adopt_parameter(*this, linear, "weight", mesh_, Shard{1},
                              {s, out_features_ / s, in_features_});
    if (linear.bias().defined()) {
      recorded->shapes["bias"] = linear.bias().shape();
      bias_ = adopt_parameter(*this, linear, "bias", mesh_, Shard{1}, {s, out_features_ / s});
    }
    set_attachment(internal::kStateDictShapes, recorded);
  }
  train(linear.is_training());
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  TESSEL_CHECK(x.dim() >= 1 && x.size(-1) == in_features_, InvalidArgument,
               "ColumnParallelLinear expects (..., {}), got {}", in_features_, x.str());
  const auto group = mesh_.group();
  // Sections are stored (S, rows, ...); the matmul sees them stacked: (S * rows, in).
  const Tensor w = style_.sections > 1 ? reshape(*weight_, {-1, in_features_}) : *weight_;
  const Tensor b = bias_ == nullptr      ? Tensor()
                   : style_.sections > 1 ? reshape(*bias_, {-1})
                                         : *bias_;
  const Placement& in = style_.input_layout;
  Tensor y;
  if (in.is_shard() && style_.overlap_chunks > 0) {
    y = all_gather_linear(x, w, b, group, in.dim(), style_.overlap_chunks);
  } else {
    const Tensor h =
        in.is_replicate() ? copy_to_tp_region(x, group) : gather_from_sp_region(x, group, in.dim());
    y = linear(h, w, b);
  }
  if (style_.output_layout.is_replicate()) y = gather_from_tp_region(y, group, -1, out_features_);
  return y;
}

// ---- RowParallelLinear -------------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(nn::Linear& linear, const DeviceMesh& tp_mesh,
                                     RowwiseParallel style)
    : Module("RowParallelLinear"), mesh_(tp_mesh), style_(std::move(style)) {
  check_tp_mesh(tp_mesh, "RowParallelLinear");
  check_rowwise(linear, style_);
  const Placement in = style_.input_layout.value_or(Shard{-1});
  style_.input_layout = in;
  in_features_ = linear.weight().size(1);
  weight_ = adopt_parameter(*this, linear, "weight", mesh_, Shard{1});
  if (linear.bias().defined()) bias_ = adopt_parameter(*this, linear, "bias", mesh_, Replicate{});
  train(linear.is_training());
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  const auto group = mesh_.group();
  Tensor h = x;
  if (style_.input_layout->is_replicate()) {
    TESSEL_CHECK(x.dim() >= 1 && x.size(-1) == in_features_, InvalidArgument,
                 "RowParallelLinear expects a whole (..., {}) input, got {}", in_features_,
                 x.str());
    h = scatter_to_tp_region(x, group, -1);
  }
  // Each rank's product is a partial sum over its input features.
  const Tensor y = reduce_partial(linear(h, *weight_), group, style_.output_layout);
  if (bias_ == nullptr) return y;
  // Added to sequence shards, each rank's bias gradient is its shard's share: summed.
  return add(y, style_.output_layout.is_replicate() ? *bias_ : copy_to_tp_region(*bias_, group));
}

// ---- VocabParallelEmbedding --------------------------------------------------------------------

VocabParallelEmbedding::VocabParallelEmbedding(nn::Embedding& embedding, const DeviceMesh& tp_mesh,
                                               RowwiseParallel style)
    : Module("VocabParallelEmbedding"), mesh_(tp_mesh), style_(std::move(style)) {
  check_tp_mesh(tp_mesh, "VocabParallelEmbedding");
  check_rowwise(embedding, style_);
  vocab_size_ = embedding.weight().size(0);
  std::tie(start_, rows_) = chunk_of(vocab_size_, mesh_.size(), mesh_.local_rank());
  weight_ = adopt_parameter(*this, embedding, "weight", mesh_, Shard{0});
  train(embedding.is_training());
}

Tensor VocabParallelEmbedding::forward(const Tensor& tokens) {
  TESSEL_CHECK(!is_floating(tokens.dtype()), InvalidArgument,
               "VocabParallelEmbedding expects integer tokens, got {}", tokens.str());
  // This rank's rows: tokens of other ranks look up row 0 and are zeroed. The tokens are the
  // same on every rank, so a bad one fails everywhere before the reduction.
  const std::vector<int64_t> ids = to_vector<int64_t>(tokens);
  std::vector<int64_t> local(ids.size());
  std::vector<float> mine(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_) {
      throw OutOfRange(
          fmt::format("VocabParallelEmbedding: token {} at position {} is outside "
                      "the vocabulary [0, {})",
                      ids[i], i, vocab_size_));
    }
    const bool here = ids[i] >= start_ && ids[i] < start_ + rows_;
    local[i] = here ? ids[i] - start_ : 0;
    mine[i] = here ? 1.0f : 0.0f;
  }
  const Device device = weight_->device();
  Shape out_shape = tokens.shape();
  out_shape.push_back(weight_->size(1));
  Tensor partial;
  if (rows_ == 0) {
    partial = zeros(out_shape, weight_->dtype(), device);
  } else {
    const Tensor index = tessel::to(view(from_vector<int64_t>(local), tokens.shape()), device);
    Shape mask_shape = tokens.shape();
    mask_shape.push_back(1);
    const Tensor mask = tessel::to(
        tessel::to(view(from_vector<float>(mine), mask_shape), weight_->dtype()), device);
    partial = mul(embedding(*weight_, index), mask);
  }
  return reduce_partial(partial, mesh_.group(), style_.output_layout);
}

}  // namespace tessel
