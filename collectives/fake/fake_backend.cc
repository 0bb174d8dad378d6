#include "tessel/collectives/fake/fake_backend.h"

#include <numeric>

#include "tessel/base/error.h"
#include "tessel/collectives/comm_backend.h"

namespace tessel::fake {

void FakeLog::append(const FakeCall& call) {
  std::lock_guard lock(mutex_);
  calls_.push_back(call);
}

std::vector<FakeCall> FakeLog::calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

int64_t FakeLog::total_bytes_sent() const {
  std::lock_guard lock(mutex_);
  int64_t total = 0;
  for (const auto& c : calls_) total += c.bytes_sent;
  return total;
}

namespace {

class FakeBackend final : public CommBackend {
 public:
  FakeBackend(int rank, int size, uint64_t group_id, std::shared_ptr<FakeLog> log)
      : rank_(rank), size_(size), group_id_(group_id), log_(std::move(log)) {}

  std::string_view name() const override { return "fake"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void check_device(const Tensor&) const override {}  // any device: nothing is touched

  // Bytes per rank of the bandwidth-optimal ring algorithms: all_reduce 2(n-1)/n of the data,
  // all_gather / reduce_scatter (n-1)/n of the full buffer.
  void all_reduce(Tensor& t, ReduceOp, const OpContext& ctx) override {
    note(fr::OpType::kAllReduce, ctx.seq, -1, 2 * ring_share(static_cast<int64_t>(t.nbytes())));
  }
  void broadcast(Tensor& t, int root, const OpContext& ctx) override {
    note(fr::OpType::kBroadcast, ctx.seq, root,
         rank_ == root ? static_cast<int64_t>(t.nbytes()) : 0);
  }
  void all_gather(const Tensor&, Tensor& out, std::span<const int64_t>,
                  const OpContext& ctx) override {
    note(fr::OpType::kAllGather, ctx.seq, -1, ring_share(static_cast<int64_t>(out.nbytes())));
  }
  void reduce_scatter(const Tensor& in, Tensor&, std::span<const int64_t>, ReduceOp,
                      const OpContext& ctx) override {
    note(fr::OpType::kReduceScatter, ctx.seq, -1, ring_share(static_cast<int64_t>(in.nbytes())));
  }
  void all_to_all(const Tensor& in, Tensor&, std::span<const int64_t> send_counts,
                  std::span<const int64_t>, const OpContext& ctx) override {
    const int64_t own = send_counts[rank_] * static_cast<int64_t>(in.element_size());
    note(fr::OpType::kAllToAll, ctx.seq, -1, static_cast<int64_t>(in.nbytes()) - own);
  }
  void send(const Tensor& t, int peer, int, const OpContext&) override {
    note(fr::OpType::kSend, 0, peer, static_cast<int64_t>(t.nbytes()));
  }
  void recv(Tensor&, int peer, int, const OpContext&) override {
    note(fr::OpType::kRecv, 0, peer, 0);
  }
  void barrier(const OpContext& ctx) override { note(fr::OpType::kBarrier, ctx.seq, -1, 0); }
  // Only splits whose members were given (SplitOptions::members) reach here with a membership:
  // the colour exchange, an all_gather, moves no data on this backend.
  std::unique_ptr<CommBackend> split(const SplitRequest& request) override {
    if (request.color == kNoColor) return nullptr;
    TESSEL_CHECK(request.members_given, NotImplemented,
                 "the fake backend cannot split by exchanging colours (no data moves); pass "
                 "SplitOptions::members or create the sub-group with fake::create_process_group");
    return std::make_unique<FakeBackend>(request.new_rank,
                                         static_cast<int>(request.members.size()),
                                         request.options.id, log_);
  }

 private:
  int64_t ring_share(int64_t bytes) const { return size_ == 1 ? 0 : bytes * (size_ - 1) / size_; }
  void note(fr::OpType op, uint64_t seq, int peer, int64_t bytes) {
    if (log_) log_->append(FakeCall{group_id_, op, seq, peer, bytes});
  }

  const int rank_;
  const int size_;
  const uint64_t group_id_;
  std::shared_ptr<FakeLog> log_;
};

}  // namespace

std::shared_ptr<ProcessGroup> create_process_group(int rank, int size,
                                                   std::shared_ptr<FakeLog> log,
                                                   ProcessGroupOptions options) {
  TESSEL_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
               "fake group: rank {} is not in [0, {})", rank, size);
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  const uint64_t id = options.id;
  return std::make_shared<ProcessGroup>(
      std::make_unique<FakeBackend>(rank, size, id, std::move(log)), std::move(options),
      std::move(ranks));
}

}  // namespace tessel::fake
