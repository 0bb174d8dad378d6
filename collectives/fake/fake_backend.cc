#include "tessel/collectives/fake/fake_backend.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <numeric>
#include <string>

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

Nanoseconds FakeLog::total_modeled() const {
  std::lock_guard lock(mutex_);
  Nanoseconds total{0};
  for (const auto& c : calls_) total += c.modeled;
  return total;
}

namespace {

// The time model and the one thing that interrupts it (abort), shared by a group and the
// sub-groups split from it (each waits on its own calls; abort wakes only its own group).
class LinkModel {
 public:
  LinkModel(Nanoseconds latency, double bytes_per_second)
      : latency_(latency), bytes_per_second_(bytes_per_second) {}

  Nanoseconds latency() const { return latency_; }
  double bytes_per_second() const { return bytes_per_second_; }

  Nanoseconds duration(int64_t bytes) const {
    Nanoseconds d = latency_;
    if (bytes_per_second_ > 0 && bytes > 0) {
      d += Nanoseconds(
          static_cast<int64_t>(std::ceil(static_cast<double>(bytes) * 1e9 / bytes_per_second_)));
    }
    return d;
  }

  // Takes the call's modeled time on the link, asleep, unless aborted first; fails at the call's
  // timeout when the modeled time is longer. The link starts a call when it was issued or when
  // the link finished the previous one, whichever is later: not when this thread got to it, since
  // a thread that wakes late on a loaded machine is the simulation's delay, not the link's.
  void wait(Nanoseconds modeled, const OpContext& ctx) {
    // Linux may end a sleep up to the thread's timer slack (50 us by default) late; a modeled
    // call should end on time.
    thread_local const bool tight_slack = prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0) == 0;
    (void)tight_slack;
    const auto now = SteadyClock::now();
    std::unique_lock lock(mutex_);
    const auto start = std::max(std::min(ctx.issued, now), busy_until_);
    const auto done = start + modeled;
    busy_until_ = done;
    const auto give_up = now + ctx.timeout;
    cv_.wait_until(lock, modeled > ctx.timeout ? give_up : done, [this] { return aborted_; });
    if (aborted_) throw CommError(fmt::format("fake group aborted: {}", abort_reason_));
    if (modeled > ctx.timeout) {
      throw Timeout(fmt::format("the modeled time {} is longer than the call's timeout {}",
                                format_duration(modeled), format_duration(ctx.timeout)));
    }
  }

  void abort(const std::string& reason) {
    {
      std::lock_guard lock(mutex_);
      aborted_ = true;
      abort_reason_ = reason;
    }
    cv_.notify_all();
  }

 private:
  const Nanoseconds latency_;
  const double bytes_per_second_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool aborted_ = false;                // guarded by mutex_
  std::string abort_reason_;            // guarded by mutex_
  SteadyClock::time_point busy_until_;  // the previous call's modeled end; guarded by mutex_
};

class FakeBackend final : public CommBackend {
 public:
  FakeBackend(int rank, int size, uint64_t group_id, std::shared_ptr<FakeLog> log,
              Nanoseconds latency, double bytes_per_second)
      : rank_(rank),
        size_(size),
        group_id_(group_id),
        log_(std::move(log)),
        link_(latency, bytes_per_second) {}

  std::string_view name() const override { return "fake"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void check_device(const Tensor&) const override {}  // any device: nothing is touched

  // Bytes per rank of the bandwidth-optimal ring algorithms: all_reduce 2(n-1)/n of the data,
  // all_gather / reduce_scatter (n-1)/n of the full buffer.
  void all_reduce(Tensor& t, ReduceOp, const OpContext& ctx) override {
    note(fr::OpType::kAllReduce, ctx, -1, 2 * ring_share(static_cast<int64_t>(t.nbytes())));
  }
  void broadcast(Tensor& t, int root, const OpContext& ctx) override {
    note(fr::OpType::kBroadcast, ctx, root, rank_ == root ? static_cast<int64_t>(t.nbytes()) : 0);
  }
  void all_gather(const Tensor&, Tensor& out, std::span<const int64_t>,
                  const OpContext& ctx) override {
    note(fr::OpType::kAllGather, ctx, -1, ring_share(static_cast<int64_t>(out.nbytes())));
  }
  void reduce_scatter(const Tensor& in, Tensor&, std::span<const int64_t>, ReduceOp,
                      const OpContext& ctx) override {
    note(fr::OpType::kReduceScatter, ctx, -1, ring_share(static_cast<int64_t>(in.nbytes())));
  }
  void all_to_all(const Tensor& in, Tensor&, std::span<const int64_t> send_counts,
                  std::span<const int64_t>, const OpContext& ctx) override {
    const int64_t own = send_counts[rank_] * static_cast<int64_t>(in.element_size());
    note(fr::OpType::kAllToAll, ctx, -1, static_cast<int64_t>(in.nbytes()) - own);
  }
  void all_to_all_views(std::span<const Tensor> inputs, std::span<const Tensor>,
                        const OpContext& ctx) override {
    int64_t bytes = 0;
    for (int j = 0; j < size_; ++j) {
      if (j != rank_) bytes += static_cast<int64_t>(inputs[static_cast<size_t>(j)].nbytes());
    }
    note(fr::OpType::kAllToAll, ctx, -1, bytes);
  }
  void send(const Tensor& t, int peer, int, const OpContext& ctx) override {
    note(fr::OpType::kSend, ctx, peer, static_cast<int64_t>(t.nbytes()), /*p2p=*/true);
  }
  void recv(Tensor&, int peer, int, const OpContext& ctx) override {
    note(fr::OpType::kRecv, ctx, peer, 0, /*p2p=*/true);
  }
  void barrier(const OpContext& ctx) override { note(fr::OpType::kBarrier, ctx, -1, 0); }
  // Only splits whose members were given (SplitOptions::members) reach here with a membership:
  // the colour exchange, an all_gather, moves no data on this backend.
  std::unique_ptr<CommBackend> split(const SplitRequest& request) override {
    if (request.color == kNoColor) return nullptr;
    TESSEL_CHECK(request.members_given, NotImplemented,
                 "the fake backend cannot split by exchanging colours (no data moves); pass "
                 "SplitOptions::members or create the sub-group with fake::create_process_group");
    return std::make_unique<FakeBackend>(request.new_rank, static_cast<int>(request.members.size()),
                                         request.options.id, log_, link_.latency(),
                                         link_.bytes_per_second());
  }
  void abort(const std::string& reason) override { link_.abort(reason); }

 private:
  int64_t ring_share(int64_t bytes) const { return size_ == 1 ? 0 : bytes * (size_ - 1) / size_; }
  // Logs the call, then takes its modeled time.
  void note(fr::OpType op, const OpContext& ctx, int peer, int64_t bytes, bool p2p = false) {
    const Nanoseconds modeled = link_.duration(bytes);
    if (log_) log_->append(FakeCall{group_id_, op, p2p ? 0 : ctx.seq, peer, bytes, modeled});
    if (modeled > Nanoseconds::zero()) link_.wait(modeled, ctx);
  }

  const int rank_;
  const int size_;
  const uint64_t group_id_;
  std::shared_ptr<FakeLog> log_;
  LinkModel link_;
};

}  // namespace

std::shared_ptr<ProcessGroup> create_process_group(int rank, int size, FakeOptions fake,
                                                   ProcessGroupOptions options) {
  TESSEL_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
               "fake group: rank {} is not in [0, {})", rank, size);
  TESSEL_CHECK(fake.latency >= Nanoseconds::zero(), InvalidArgument,
               "fake group: latency {}ns is negative", fake.latency.count());
  TESSEL_CHECK(std::isfinite(fake.bytes_per_second) && fake.bytes_per_second >= 0, InvalidArgument,
               "fake group: bytes_per_second {} must be finite and >= 0 (0: unlimited)",
               fake.bytes_per_second);
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  const uint64_t id = options.id;
  return std::make_shared<ProcessGroup>(
      std::make_unique<FakeBackend>(rank, size, id, std::move(fake.log), fake.latency,
                                    fake.bytes_per_second),
      std::move(options), std::move(ranks));
}

std::shared_ptr<ProcessGroup> create_process_group(int rank, int size, std::shared_ptr<FakeLog> log,
                                                   ProcessGroupOptions options) {
  return create_process_group(rank, size, FakeOptions{.log = std::move(log)}, std::move(options));
}

}  // namespace tessel::fake
