#include "tessel/collectives/threads/threads_backend.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/base/error.h"
#include "tessel/collectives/comm_backend.h"
#include "tessel/collectives/internal/reduce.h"

namespace tessel::threads {
namespace {

struct Registry;

// What one rank posts for the collective in progress.
struct Post {
  const void* input = nullptr;
  void* output = nullptr;
  std::span<const int64_t> send_counts = {};
};

// State shared by the ranks of one group.
struct Shared {
  Shared(int size, std::shared_ptr<Registry> registry, uint64_t uid)
      : size(size),
        registry(std::move(registry)),
        uid(uid),
        posts(static_cast<size_t>(size)),
        arrived(static_cast<size_t>(size), false),
        entered_seq(static_cast<size_t>(size), 0) {}

  const int size;
  const std::shared_ptr<Registry> registry;
  const uint64_t uid;
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<Post> posts;           // written by each rank before the first barrier
  std::vector<bool> arrived;         // guarded by mutex: ranks at the current barrier
  int arrived_count = 0;             // guarded by mutex
  uint64_t generation = 0;           // guarded by mutex
  std::vector<uint64_t> entered_seq; // guarded by mutex: last collective seq each rank entered
  bool broken = false;               // guarded by mutex
  std::string broken_reason;         // guarded by mutex
  // p2p messages by (src, dst, tag), in send order; guarded by mutex.
  std::map<std::tuple<int, int, int>, std::deque<std::vector<uint8_t>>> mailboxes;
};

// Sub-groups being formed by split(), and every group of one world (so run_ranks can wake
// them all when a rank fails).
struct Registry {
  std::mutex mutex;
  uint64_t next_uid = 1;
  struct Pending {
    std::shared_ptr<Shared> shared;
    int fetched = 0;
  };
  std::map<std::string, Pending> pending;   // guarded by mutex
  std::vector<std::weak_ptr<Shared>> groups;  // guarded by mutex

  void abort_all(const std::string& reason);
};

void break_group(Shared& s, const std::string& reason) {
  {
    std::lock_guard lock(s.mutex);
    if (!s.broken) {
      s.broken = true;
      s.broken_reason = reason;
    }
  }
  s.cv.notify_all();
}

void Registry::abort_all(const std::string& reason) {
  std::vector<std::shared_ptr<Shared>> live;
  {
    std::lock_guard lock(mutex);
    for (const auto& weak : groups) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
  }
  for (const auto& s : live) break_group(*s, reason);
}

class ThreadsBackend final : public CommBackend {
 public:
  ThreadsBackend(std::shared_ptr<Shared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}

  std::string_view name() const override { return "threads"; }
  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }

  void all_reduce(Tensor& tensor, ReduceOp op, const OpContext& ctx) override {
    const size_t bytes = tensor.nbytes();
    // The tensor is both input and output, so post a private copy the others can read while
    // this rank overwrites its tensor.
    std::vector<uint8_t> copy(bytes);
    if (bytes > 0) std::memcpy(copy.data(), tensor.data_ptr(), bytes);
    enter(ctx, Post{.input = copy.data()});
    const auto deadline = Deadline::after(ctx.timeout);
    meet(ctx, deadline, "all_reduce");
    const int64_t n = tensor.numel();
    auto* out = static_cast<uint8_t*>(tensor.data_ptr());
    if (bytes > 0) {
      std::memcpy(out, shared_->posts[0].input, bytes);
      for (int r = 1; r < size(); ++r) {
        internal::reduce_into(tensor.dtype(), op, out, shared_->posts[r].input, n);
      }
      if (op == ReduceOp::kAvg) internal::divide_by(tensor.dtype(), out, n, size());
    }
    meet(ctx, deadline, "all_reduce");
  }

  void broadcast(Tensor& tensor, int root, const OpContext& ctx) override {
    enter(ctx, Post{.input = tensor.data_ptr()});
    const auto deadline = Deadline::after(ctx.timeout);
    meet(ctx, deadline, "broadcast");
    if (rank_ != root && tensor.nbytes() > 0) {
      std::memcpy(tensor.data_ptr(), shared_->posts[root].input, tensor.nbytes());
    }
    meet(ctx, deadline, "broadcast");
  }

  void all_gather(const Tensor& input, Tensor& output, std::span<const int64_t> counts,
                  const OpContext& ctx) override {
    enter(ctx, Post{.input = input.data_ptr()});
    const auto deadline = Deadline::after(ctx.timeout);
    meet(ctx, deadline, "all_gather");
    const size_t es = input.element_size();
    auto* out = static_cast<uint8_t*>(output.data_ptr());
    for (int r = 0; r < size(); ++r) {
      const size_t bytes = static_cast<size_t>(counts[r]) * es;
      if (bytes > 0) std::memcpy(out, shared_->posts[r].input, bytes);
      out += bytes;
    }
    meet(ctx, deadline, "all_gather");
  }

  void reduce_scatter(const Tensor& input, Tensor& output, std::span<const int64_t> counts,
                      ReduceOp op, const OpContext& ctx) override {
    enter(ctx, Post{.input = input.data_ptr()});
    const auto deadline = Deadline::after(ctx.timeout);
    meet(ctx, deadline, "reduce_scatter");
    const size_t es = input.element_size();
    const int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank_, int64_t{0});
    const int64_t n = counts[rank_];
    auto* out = static_cast<uint8_t*>(output.data_ptr());
    if (n > 0) {
      auto slice = [&](int r) {
        return static_cast<const uint8_t*>(shared_->posts[r].input) + offset * es;
      };
      std::memcpy(out, slice(0), static_cast<size_t>(n) * es);
      for (int r = 1; r < size(); ++r) internal::reduce_into(input.dtype(), op, out, slice(r), n);
      if (op == ReduceOp::kAvg) internal::divide_by(input.dtype(), out, n, size());
    }
    meet(ctx, deadline, "reduce_scatter");
  }

  void all_to_all(const Tensor& input, Tensor& output, std::span<const int64_t> send_counts,
                  std::span<const int64_t> recv_counts, const OpContext& ctx) override {
    enter(ctx, Post{.input = input.data_ptr(), .send_counts = send_counts});
    const auto deadline = Deadline::after(ctx.timeout);
    meet(ctx, deadline, "all_to_all");
    const size_t es = input.element_size();
    auto* out = static_cast<uint8_t*>(output.data_ptr());
    for (int r = 0; r < size(); ++r) {
      const auto& peer = shared_->posts[r];
      TESSEL_CHECK(peer.send_counts[rank_] == recv_counts[r], InvalidArgument,
                   "all_to_all: rank {} sends {} elements to rank {}, which expects {}", r,
                   peer.send_counts[rank_], rank_, recv_counts[r]);
      const int64_t offset =
          std::accumulate(peer.send_counts.begin(), peer.send_counts.begin() + rank_, int64_t{0});
      const size_t bytes = static_cast<size_t>(recv_counts[r]) * es;
      if (bytes > 0) {
        std::memcpy(out, static_cast<const uint8_t*>(peer.input) + offset * es, bytes);
      }
      out += bytes;
    }
    meet(ctx, deadline, "all_to_all");
  }

  void send(const Tensor& tensor, int peer, int tag, const OpContext&) override {
    const auto* p = static_cast<const uint8_t*>(tensor.data_ptr());
    std::vector<uint8_t> message(p, p + tensor.nbytes());
    {
      std::lock_guard lock(shared_->mutex);
      throw_if_broken();
      shared_->mailboxes[{rank_, peer, tag}].push_back(std::move(message));
    }
    shared_->cv.notify_all();
  }

  void recv(Tensor& tensor, int peer, int tag, const OpContext& ctx) override {
    const auto deadline = Deadline::after(ctx.timeout);
    std::unique_lock lock(shared_->mutex);
    auto& box = shared_->mailboxes[{peer, rank_, tag}];
    while (box.empty()) {
      throw_if_broken();
      if (shared_->cv.wait_until(lock, deadline.when()) == std::cv_status::timeout &&
          box.empty()) {
        throw Timeout(fmt::format("no message from rank {} with tag {} within {}", peer, tag,
                                  format_duration(ctx.timeout)));
      }
    }
    std::vector<uint8_t> message = std::move(box.front());
    box.pop_front();
    TESSEL_CHECK(message.size() == tensor.nbytes(), InvalidArgument,
                 "recv from rank {} tag {}: the message has {} bytes, the tensor {} ({})", peer,
                 tag, message.size(), tensor.nbytes(), tensor.str());
    if (!message.empty()) std::memcpy(tensor.data_ptr(), message.data(), message.size());
  }

  void barrier(const OpContext& ctx) override {
    enter(ctx, Post{});
    meet(ctx, Deadline::after(ctx.timeout), "barrier");
  }

  std::unique_ptr<CommBackend> split(const SplitRequest& request) override {
    if (request.color == kNoColor) return nullptr;
    // The first member to arrive creates the sub-group's state; the last to fetch it removes
    // the registry entry.
    auto& registry = *shared_->registry;
    const std::string key =
        fmt::format("{}/{}/{}", shared_->uid, request.split_index, request.color);
    std::shared_ptr<Shared> sub;
    {
      std::lock_guard lock(registry.mutex);
      auto& pending = registry.pending[key];
      if (!pending.shared) {
        pending.shared = std::make_shared<Shared>(static_cast<int>(request.members.size()),
                                                  shared_->registry, registry.next_uid++);
        std::erase_if(registry.groups, [](const auto& weak) { return weak.expired(); });
        registry.groups.push_back(pending.shared);
      }
      sub = pending.shared;
      if (++pending.fetched == sub->size) registry.pending.erase(key);
    }
    return std::make_unique<ThreadsBackend>(std::move(sub), request.new_rank);
  }

  std::vector<int> missing_ranks(uint64_t seq) const override {
    std::lock_guard lock(shared_->mutex);
    std::vector<int> missing;
    for (int r = 0; r < size(); ++r) {
      if (shared_->entered_seq[r] < seq) missing.push_back(r);
    }
    return missing;
  }

  void abort(const std::string& reason) override { break_group(*shared_, reason); }

 private:
  void throw_if_broken() const {
    if (shared_->broken) {
      throw CommError(fmt::format("threads group is unusable: {}", shared_->broken_reason));
    }
  }

  // Posts this rank's buffers for collective ctx.seq.
  void enter(const OpContext& ctx, const Post& post) {
    std::lock_guard lock(shared_->mutex);
    throw_if_broken();
    shared_->posts[rank_] = post;
    shared_->entered_seq[rank_] = ctx.seq;
  }

  // A barrier of all ranks, bounded by the deadline. A timeout breaks the group (this rank's
  // arrival was counted, so the barrier cannot be reused) and names the ranks not arrived.
  void meet(const OpContext& ctx, const Deadline& deadline, std::string_view op) {
    Shared& s = *shared_;
    std::unique_lock lock(s.mutex);
    throw_if_broken();
    const uint64_t generation = s.generation;
    s.arrived[rank_] = true;
    if (++s.arrived_count == s.size) {
      s.arrived_count = 0;
      std::fill(s.arrived.begin(), s.arrived.end(), false);
      ++s.generation;
      lock.unlock();
      s.cv.notify_all();
      return;
    }
    while (s.generation == generation) {
      throw_if_broken();
      if (s.cv.wait_until(lock, deadline.when()) == std::cv_status::timeout &&
          s.generation == generation) {
        std::vector<int> missing;
        for (int r = 0; r < s.size; ++r) {
          if (!s.arrived[r]) missing.push_back(r);
        }
        const std::string message =
            fmt::format("{} seq {} timed out after {}; ranks not arrived: [{}]", op, ctx.seq,
                        format_duration(ctx.timeout), fmt::join(missing, ", "));
        s.broken = true;
        s.broken_reason = message;
        lock.unlock();
        s.cv.notify_all();
        throw Timeout(message);
      }
    }
  }

  std::shared_ptr<Shared> shared_;
  const int rank_;
};

}  // namespace

namespace {

std::vector<std::shared_ptr<ProcessGroup>> make_world(int size, ProcessGroupOptions options,
                                                      std::shared_ptr<Registry> registry) {
  TESSEL_CHECK(size >= 1, InvalidArgument, "threads world size {} must be >= 1", size);
  auto shared = std::make_shared<Shared>(size, registry, 0);
  registry->groups.push_back(shared);
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  for (int r = 0; r < size; ++r) {
    groups.push_back(std::make_shared<ProcessGroup>(std::make_unique<ThreadsBackend>(shared, r),
                                                    options, ranks));
  }
  return groups;
}

}  // namespace

std::vector<std::shared_ptr<ProcessGroup>> create_world(int size, ProcessGroupOptions options) {
  return make_world(size, std::move(options), std::make_shared<Registry>());
}

void run_ranks(int size, const std::function<void(ProcessGroup&)>& fn,
               ProcessGroupOptions options) {
  auto registry = std::make_shared<Registry>();
  auto groups = make_world(size, std::move(options), registry);
  std::mutex mutex;
  std::exception_ptr first;
  int first_rank = -1;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*groups[static_cast<size_t>(r)]);
      } catch (...) {
        {
          std::lock_guard lock(mutex);
          if (!first) {
            first = std::current_exception();
            first_rank = r;
          }
        }
        // Wake the other ranks, in every group of this world, instead of leaving them to
        // time out.
        registry->abort_all(fmt::format("rank {} failed", r));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!first) return;
  try {
    std::rethrow_exception(first);
  } catch (const Error& e) {
    throw_error(e.kind(), fmt::format("rank {}: {}", first_rank, e.message()));
  } catch (const std::exception& e) {
    throw Internal(fmt::format("rank {}: {}", first_rank, e.what()));
  }
}

}  // namespace tessel::threads
