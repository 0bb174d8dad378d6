// Expert parallelism's all-to-all token dispatcher. See token_dispatch.h.
#include "tessel/parallel/ep/token_dispatch.h"

#include <numeric>
#include <utility>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

using Group = std::shared_ptr<ProcessGroup>;

int64_t sum_of(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

std::vector<int64_t> times(std::vector<int64_t> v, int64_t factor) {
  for (int64_t& x : v) x *= factor;
  return v;
}

// One all_to_all of rows, timed and counted into `stats` (when given).
Tensor exchange_rows(const Tensor& x, const Group& group, const std::vector<int64_t>& send_rows,
                     const std::vector<int64_t>& recv_rows, ExpertParallelStats* stats) {
  const int64_t row = shape_numel(Shape(x.shape().begin() + 1, x.shape().end()));
  Shape shape = x.shape();
  shape[0] = sum_of(recv_rows);
  Tensor out = empty(shape, x.dtype(), x.device());
  const Stopwatch clock;
  group->all_to_all(contiguous(x), out,
                    {.send_counts = times(send_rows, row), .recv_counts = times(recv_rows, row)});
  if (stats != nullptr) {
    stats->all_to_alls += 1;
    stats->all_to_all_time += clock.elapsed();
    const int64_t self = send_rows[static_cast<size_t>(group->rank())];
    stats->bytes_sent +=
        (sum_of(send_rows) - self) * row * static_cast<int64_t>(dtype_size(x.dtype()));
  }
  return out;
}

Tensor all_to_all_rows_timed(const Tensor& x, const Group& group,
                             const std::vector<int64_t>& send_rows,
                             const std::vector<int64_t>& recv_rows,
                             std::shared_ptr<ExpertParallelStats> stats) {
  const auto n = static_cast<size_t>(group->size());
  TESSEL_CHECK(x.dim() >= 1 && send_rows.size() == n && recv_rows.size() == n, InvalidArgument,
               "all_to_all_rows: a group of {} ranks needs {} send and receive splits, got {} and "
               "{} (x {})",
               n, n, send_rows.size(), recv_rows.size(), x.str());
  TESSEL_CHECK(sum_of(send_rows) == x.size(0), InvalidArgument,
               "all_to_all_rows: the send splits sum to {} rows but x {} has {}", sum_of(send_rows),
               x.str(), x.size(0));
  return apply_function(
      "all_to_all_rows", {x},
      [&](FunctionContext&, const std::vector<Tensor>& in) {
        return std::vector<Tensor>{exchange_rows(in[0], group, send_rows, recv_rows, stats.get())};
      },
      [group, send_rows, recv_rows, stats](FunctionContext&, const std::vector<Tensor>& grad) {
        return std::vector<Tensor>{
            exchange_rows(grad[0], group, recv_rows, send_rows, stats.get())};
      })[0];
}

// The rows of x in the order `index` names (a permutation; differentiable).
Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& index) {
  if (index.empty()) return x;
  return embedding(x, to(from_vector<int64_t>(index), x.device()));
}

}  // namespace

ExpertParallelStats& ExpertParallelStats::operator+=(const ExpertParallelStats& o) {
  all_to_alls += o.all_to_alls;
  bytes_sent += o.bytes_sent;
  all_to_all_time += o.all_to_all_time;
  return *this;
}

Tensor all_to_all_rows(const Tensor& x, const std::shared_ptr<ProcessGroup>& group,
                       const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows) {
  return all_to_all_rows_timed(x, group, send_rows, recv_rows, nullptr);
}

AllToAllDispatcher::AllToAllDispatcher(int64_t num_experts, DeviceMesh ep, DeviceMesh data)
    : num_experts_(num_experts),
      ep_mesh_(std::move(ep)),
      data_mesh_(std::move(data)),
      stats_(std::make_shared<ExpertParallelStats>()) {
  TESSEL_CHECK(ep_mesh_.ndim() == 1 && data_mesh_.ndim() == 1, InvalidArgument,
               "AllToAllDispatcher takes 1-D ep and data meshes, got {} and {}",
               ep_mesh_.shape_str(), data_mesh_.shape_str());
  TESSEL_CHECK(num_experts_ % ep_mesh_.size() == 0, InvalidArgument,
               "AllToAllDispatcher: {} experts do not divide over an ep group of {} ranks",
               num_experts_, ep_mesh_.size());
}

void AllToAllDispatcher::make_groups() {
  if (ep_ != nullptr) return;
  ep_ = ep_mesh_.group();
  data_ = data_mesh_.group();
}

std::vector<int64_t> AllToAllDispatcher::global_counts(const std::vector<int64_t>& local) {
  make_groups();
  if (data_->size() == 1) return local;
  Tensor counts = to(from_vector<int64_t>(local), data_->default_device());
  data_->all_reduce(counts);
  return to_vector<int64_t>(to(counts, Device::cpu()));
}

Tensor AllToAllDispatcher::dispatch(const Tensor& xs, const std::vector<int64_t>& counts,
                                    std::vector<int64_t>* offsets) {
  make_groups();
  const int64_t P = ep_->size(), L = num_experts_ / P;
  TESSEL_CHECK(static_cast<int64_t>(counts.size()) == num_experts_ && sum_of(counts) == xs.size(0),
               InvalidArgument,
               "AllToAllDispatcher::dispatch: {} counts summing to {} for {} experts and rows {}",
               counts.size(), sum_of(counts), num_experts_, xs.str());
  if (P == 1) {  // every expert is here: no exchange, the rows stay in order
    send_rows_ = recv_rows_ = {xs.size(0)};
    by_source_.clear();
    offsets->assign(1, 0);
    for (int64_t c : counts) offsets->push_back(offsets->back() + c);
    return xs;
  }
  // 1. The split sizes: rank j learns how many rows of each of its L experts each rank sends.
  Tensor sent = to(from_vector<int64_t>(counts), ep_->default_device());
  Tensor got = empty({num_experts_}, DType::kI64, ep_->default_device());
  {
    const Stopwatch clock;
    ep_->all_to_all(sent, got);
    stats_->all_to_alls += 1;
    stats_->all_to_all_time += clock.elapsed();
  }
  const std::vector<int64_t> from = to_vector<int64_t>(to(got, Device::cpu()));  // [s * L + l]
  send_rows_.assign(static_cast<size_t>(P), 0);
  recv_rows_.assign(static_cast<size_t>(P), 0);
  for (int64_t j = 0; j < P; ++j) {
    for (int64_t l = 0; l < L; ++l) {
      send_rows_[j] += counts[j * L + l];
      recv_rows_[j] += from[j * L + l];
    }
  }
  // 2. The rows, arriving as blocks [source s][local expert l].
  const Tensor received = all_to_all_rows_timed(xs, ep_, send_rows_, recv_rows_, stats_);
  // 3. Regrouped as [l][s]: each local expert's rows contiguous, by source rank.
  std::vector<int64_t> block_start(static_cast<size_t>(P * L));
  int64_t at = 0;
  for (int64_t i = 0; i < P * L; ++i) {
    block_start[i] = at;
    at += from[i];
  }
  std::vector<int64_t> by_expert;
  by_expert.reserve(static_cast<size_t>(at));
  offsets->assign(static_cast<size_t>(L + 1), 0);
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t s = 0; s < P; ++s) {
      for (int64_t r = 0; r < from[s * L + l]; ++r) by_expert.push_back(block_start[s * L + l] + r);
    }
    (*offsets)[l + 1] = static_cast<int64_t>(by_expert.size());
  }
  // The inverse permutation, for combine (none needed when the order is already right).
  by_source_.assign(by_expert.size(), 0);
  bool identity = true;
  for (size_t i = 0; i < by_expert.size(); ++i) {
    by_source_[by_expert[i]] = static_cast<int64_t>(i);
    identity = identity && by_expert[i] == static_cast<int64_t>(i);
  }
  if (identity) {
    by_source_.clear();
    return received;
  }
  return gather_rows(received, by_expert);
}

Tensor AllToAllDispatcher::combine(const Tensor& ys) {
  TESSEL_CHECK(ys.dim() >= 1 && ys.size(0) == sum_of(recv_rows_), InvalidArgument,
               "AllToAllDispatcher::combine: expected the {} rows of the last dispatch, got {}",
               sum_of(recv_rows_), ys.str());
  if (ep_->size() == 1) return ys;
  // 4. Back to [source][local expert], then 5. home to the rank each row came from.
  return all_to_all_rows_timed(gather_rows(ys, by_source_), ep_, recv_rows_, send_rows_, stats_);
}

}  // namespace tessel
