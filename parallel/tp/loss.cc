// loss_parallel_cross_entropy: the cross-entropy of vocabulary-split logits. See loss.h.
#include "tessel/parallel/tp/loss.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/parallel/dtensor/dtensor_spec.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

// What backward needs: exp(logits - row max), the rows' sums, this rank's one-hot targets and
// the weight of each row (1 / rows counted, 0 for ignored rows).
struct LossState {
  Tensor exps, sums, one_hot, row_weight;
  Shape shape;
  DType dtype;
};

}  // namespace

Tensor loss_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                   const DeviceMesh& tp_mesh, int64_t vocab_size,
                                   int64_t ignore_index) {
  TESSEL_CHECK(tp_mesh.ndim() == 1, InvalidArgument,
               "loss_parallel_cross_entropy needs the 1-D tensor-parallel mesh (mesh[\"tp\"]), "
               "got {}",
               tp_mesh.shape_str());
  const auto group = tp_mesh.group();
  const auto [start, columns] = chunk_of(vocab_size, group->size(), group->rank());
  TESSEL_CHECK(logits.dim() >= 1 && is_floating(logits.dtype()) && logits.size(-1) == columns &&
                   targets.dim() == logits.dim() - 1,
               InvalidArgument,
               "loss_parallel_cross_entropy: rank {} of {} holds columns [{}, {}) of a vocabulary "
               "of {}, so it needs floating logits (..., {}) and targets (...), got {} and {}",
               group->rank(), group->size(), start, start + columns, vocab_size, columns,
               logits.str(), targets.str());
  const int64_t rows = targets.numel();
  TESSEL_CHECK(logits.numel() == rows * columns, InvalidArgument,
               "loss_parallel_cross_entropy: logits {} and targets {} disagree on the rows",
               logits.str(), targets.str());
  // The targets are the same on every rank: check them and mark this rank's here.
  const std::vector<int64_t> ids = to_vector<int64_t>(targets);
  std::vector<int64_t> local(ids.size(), -1);
  std::vector<float> counted(ids.size(), 0.0f);
  int64_t count = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == ignore_index) continue;
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      throw OutOfRange(
          fmt::format("loss_parallel_cross_entropy: target {} at position {} is "
                      "outside [0, {})",
                      ids[i], i, vocab_size));
    }
    counted[i] = 1.0f;
    ++count;
    if (ids[i] >= start && ids[i] < start + columns) local[i] = ids[i] - start;
  }
  const Device device = logits.device();
  auto forward = [&](FunctionContext& ctx, const std::vector<Tensor>& in) {
    const Tensor x = contiguous(to(reshape(in[0], {rows, columns}), DType::kF32));
    Tensor row_max =
        columns > 0 ? contiguous(max(x, 1))
                    : full({rows}, -std::numeric_limits<double>::infinity(), DType::kF32, device);
    group->all_reduce(row_max, {.op = ReduceOp::kMax});
    const Tensor shifted = sub(x, unsqueeze(row_max, 1));
    const Tensor exps = exp(shifted);
    const Tensor one_hot = to(eq(unsqueeze(arange(columns, DType::kI64, device), 0),
                                 unsqueeze(to(from_vector<int64_t>(local), device), 1)),
                              DType::kF32);
    // One all_reduce for both sums: exponentials and the target's shifted logit.
    Tensor sums = contiguous(stack({sum(exps, {1}), sum(mul(shifted, one_hot), {1})}));
    group->all_reduce(sums);
    const Tensor row_weight =
        div(to(from_vector<float>(counted), device), static_cast<double>(count));
    const Tensor per_row = sub(log(select(sums, 0, 0)), select(sums, 0, 1));
    ctx.data =
        LossState{exps, select(sums, 0, 0), one_hot, row_weight, in[0].shape(), in[0].dtype()};
    return std::vector<Tensor>{sum(mul(per_row, row_weight))};
  };
  auto backward = [](FunctionContext& ctx, const std::vector<Tensor>& g) {
    const auto& s = std::any_cast<const LossState&>(ctx.data);
    // d loss / d logit = (softmax - one_hot) * row weight, on this rank's columns.
    const Tensor softmax = div(s.exps, unsqueeze(s.sums, 1));
    const Tensor grad = mul(mul(sub(softmax, s.one_hot), unsqueeze(s.row_weight, 1)), g[0]);
    return std::vector<Tensor>{to(reshape(grad, s.shape), s.dtype)};
  };
  return apply_function("loss_parallel_cross_entropy", {logits}, forward, backward).at(0);
}

}  // namespace tessel
