#include "tessel/collectives/threads/threads_backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <tuple>

#include "tessel/base/error.h"
#include "tessel/collectives/comm_backend.h"
#include "tessel/collectives/internal/reduce.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/stream.h"

namespace tessel::threads {
namespace {

struct Registry;

// What one rank posts for the collective in progress. Host tensors post raw pointers; device
// tensors post the tensor and an event the others wait for before reading it.
struct Post {
  const void* input = nullptr;
  void* output = nullptr;
  std::span<const int64_t> send_counts = {};
  DeviceType device_type = DeviceType::kCPU;  // of the posted tensors; every rank's must agree
  Tensor tensor = {};                         // device tensors: what the others read
  std::optional<Event> ready = {};  // device tensors: `tensor` is ready once this completes
};

// A message in flight between two ranks: host bytes, or a device tensor (the sender's copy).
struct Message {
  std::vector<uint8_t> bytes;
  Tensor device = {};
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
  std::vector<Post> posts;            // written by each rank before the first barrier
  std::vector<bool> arrived;          // guarded by mutex: ranks at the current barrier
  int arrived_count = 0;              // guarded by mutex
  uint64_t generation = 0;            // guarded by mutex
  std::vector<uint64_t> entered_seq;  // guarded by mutex: last collective seq each rank entered
  bool broken = false;                // guarded by mutex
  std::string broken_reason;          // guarded by mutex
  // p2p messages by (src, dst, tag), in send order; guarded by mutex.
  std::map<std::tuple<int, int, int>, std::deque<Message>> mailboxes;
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
  std::map<std::string, Pending> pending;     // guarded by mutex
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
  // CPU and CUDA tensors; the ranks of one collective must all use one device type.
  void check_device(const Tensor& tensor) const override {
    TESSEL_CHECK(tensor.device().is_cpu() || tensor.device().is_cuda(), InvalidArgument,
                 "the threads backend takes CPU or CUDA tensors, got {}", tensor.str());
  }

  void all_reduce(Tensor& tensor, ReduceOp op, const OpContext& ctx) override {
    if (on_device(tensor)) return device_all_reduce(tensor, op, ctx);
    const size_t bytes = tensor.nbytes();
    // The tensor is both input and output, so post a private copy the others can read while
    // this rank overwrites its tensor.
    std::vector<uint8_t> copy(bytes);
    if (bytes > 0) std::memcpy(copy.data(), tensor.data_ptr(), bytes);
    enter(ctx, Post{.input = copy.data()});
    const auto deadline = Deadline::after(ctx.timeout);
    meet_posts(ctx, deadline, "all_reduce");
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
    if (on_device(tensor)) return device_broadcast(tensor, root, ctx);
    enter(ctx, Post{.input = tensor.data_ptr()});
    const auto deadline = Deadline::after(ctx.timeout);
    meet_posts(ctx, deadline, "broadcast");
    if (rank_ != root && tensor.nbytes() > 0) {
      std::memcpy(tensor.data_ptr(), shared_->posts[root].input, tensor.nbytes());
    }
    meet(ctx, deadline, "broadcast");
  }

  void all_gather(const Tensor& input, Tensor& output, std::span<const int64_t> counts,
                  const OpContext& ctx) override {
    if (on_device(input)) return device_all_gather(input, output, counts, ctx);
    enter(ctx, Post{.input = input.data_ptr()});
    const auto deadline = Deadline::after(ctx.timeout);
    meet_posts(ctx, deadline, "all_gather");
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
    if (on_device(input)) return device_reduce_scatter(input, output, counts, op, ctx);
    enter(ctx, Post{.input = input.data_ptr()});
    const auto deadline = Deadline::after(ctx.timeout);
    meet_posts(ctx, deadline, "reduce_scatter");
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
    if (on_device(input)) return device_all_to_all(input, output, send_counts, recv_counts, ctx);
    enter(ctx, Post{.input = input.data_ptr(), .send_counts = send_counts});
    const auto deadline = Deadline::after(ctx.timeout);
    meet_posts(ctx, deadline, "all_to_all");
    const size_t es = input.element_size();
    auto* out = static_cast<uint8_t*>(output.data_ptr());
    for (int r = 0; r < size(); ++r) {
      const auto& peer = shared_->posts[r];
      const int64_t offset = send_offset(peer, r, recv_counts[r]);
      const size_t bytes = static_cast<size_t>(recv_counts[r]) * es;
      if (bytes > 0) {
        std::memcpy(out, static_cast<const uint8_t*>(peer.input) + offset * es, bytes);
      }
      out += bytes;
    }
    meet(ctx, deadline, "all_to_all");
  }

  void send(const Tensor& tensor, int peer, int tag, const OpContext& ctx) override {
    Message message;
    if (on_device(tensor)) {
      message.device = device_copy_for_send(tensor, ctx);
    } else {
      const auto* p = static_cast<const uint8_t*>(tensor.data_ptr());
      message.bytes.assign(p, p + tensor.nbytes());
    }
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
      if (shared_->cv.wait_until(lock, deadline.when()) == std::cv_status::timeout && box.empty()) {
        throw Timeout(fmt::format("no message from rank {} with tag {} within {}", peer, tag,
                                  format_duration(ctx.timeout)));
      }
    }
    Message message = std::move(box.front());
    box.pop_front();
    lock.unlock();
    TESSEL_CHECK(message.device.defined() == on_device(tensor), InvalidArgument,
                 "recv from rank {} tag {}: the message is {} but the tensor is {}", peer, tag,
                 message.device.defined() ? message.device.str() : "in host memory", tensor.str());
    if (on_device(tensor)) return device_receive(tensor, message.device, peer, tag, ctx);
    TESSEL_CHECK(message.bytes.size() == tensor.nbytes(), InvalidArgument,
                 "recv from rank {} tag {}: the message has {} bytes, the tensor {} ({})", peer,
                 tag, message.bytes.size(), tensor.nbytes(), tensor.str());
    if (!message.bytes.empty()) {
      std::memcpy(tensor.data_ptr(), message.bytes.data(), message.bytes.size());
    }
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

  // The first meeting of a collective, after which the ranks read each other's posts: all
  // posted tensors must be of one device type. Every rank sees the same posts, so every rank
  // throws the same error and none reads memory it cannot.
  void meet_posts(const OpContext& ctx, const Deadline& deadline, std::string_view op) {
    meet(ctx, deadline, op);
    const DeviceType first = shared_->posts[0].device_type;
    for (int r = 1; r < size(); ++r) {
      const DeviceType theirs = shared_->posts[r].device_type;
      TESSEL_CHECK(theirs == first, InvalidArgument,
                   "{} seq {}: rank 0 passed {} tensors but rank {} passed {} tensors; the ranks "
                   "of a threads group must use one device type",
                   op, ctx.seq, device_type_name(first), r, device_type_name(theirs));
    }
  }

  // Where rank r's elements for this rank start in its all_to_all input, after checking that
  // it sends as many as this rank expects.
  int64_t send_offset(const Post& peer, int r, int64_t expected) const {
    TESSEL_CHECK(peer.send_counts[rank_] == expected, InvalidArgument,
                 "all_to_all: rank {} sends {} elements to rank {}, which expects {}", r,
                 peer.send_counts[rank_], rank_, expected);
    return std::accumulate(peer.send_counts.begin(), peer.send_counts.begin() + rank_, int64_t{0});
  }

  // ---- Device tensors (CUDA) ----------------------------------------------------------------
  // The ranks share one process, so each reads the others' device memory directly (on one GPU,
  // or across GPUs). One collective:
  //   1. this rank's stream waits for the caller's stream (an event); the rank posts its tensor
  //      (all_reduce: a private copy made on this stream) with an event recorded after it;
  //   2. the ranks meet; each waits on the host for every rank's event: all posts are ready;
  //   3. each copies and reduces with tensor ops on its own stream, in rank order (every rank
  //      gets the same bits), then waits on the host for that stream: it is done reading the
  //      others' memory and writing its output;
  //   4. the ranks meet again, so no rank leaves (and no posted buffer is freed or reused)
  //      while another still reads it.
  // The host blocks, as on the CPU; results are complete on the device when a call returns, so
  // the caller's stream needs no event and the memory no record_stream.

  static bool on_device(const Tensor& t) { return !t.device().is_cpu(); }

  // Step 1: this rank's stream on `device` (made on first use), ordered after the caller's.
  Stream begin_on_stream(Device device, const OpContext& ctx) {
    if (!stream_ || stream_->device() != device) stream_ = create_stream(device);
    if (ctx.issued_on_stream && ctx.issued_on_stream->device() == device) {
      stream_->wait(*ctx.issued_on_stream);  // recorded when the caller issued the call
      return *stream_;
    }
    const Stream caller =
        ctx.stream && ctx.stream->device() == device ? *ctx.stream : current_stream(device);
    Event caller_done(device);
    caller_done.record(caller);
    stream_->wait(caller_done);
    return *stream_;
  }

  // Step 1's post: `tensor` (the caller's, or made on this rank's stream) is ready once this
  // rank's stream gets this far.
  void post_device(const OpContext& ctx, const Tensor& tensor,
                   std::span<const int64_t> send_counts = {}) {
    Event ready(stream_->device());
    ready.record(*stream_);
    enter(ctx, Post{.send_counts = send_counts,
                    .device_type = tensor.device().type,
                    .tensor = tensor,
                    .ready = ready});
  }

  // Steps 2-4 around `compute` (step 3's tensor ops, issued on this rank's stream).
  template <typename F>
  void exchange(const OpContext& ctx, std::string_view op, F&& compute) {
    const auto deadline = Deadline::after(ctx.timeout);
    meet_posts(ctx, deadline, op);
    std::exception_ptr error;
    try {
      for (const Post& p : shared_->posts) p.ready->synchronize();
      StreamGuard on_stream(*stream_);
      NoGradGuard no_grad;
      compute();
      stream_->synchronize();
    } catch (...) {
      // Meet all the same: the others may still be reading this rank's post.
      error = std::current_exception();
      try {
        stream_->synchronize();
      } catch (...) {
      }
    }
    meet(ctx, deadline, op);
    {
      std::lock_guard lock(shared_->mutex);
      shared_->posts[rank_] = Post{};  // the others are done with it
    }
    if (error) std::rethrow_exception(error);
  }

  // Rank r's posted tensor, flat, on `device` (a copy when it lives on another GPU).
  Tensor posted(int r, Device device) const {
    const Tensor& t = shared_->posts[r].tensor;
    const Tensor flat = view(t, {t.numel()});
    return flat.device() == device ? flat : to(flat, device);
  }

  // acc = acc (op) x on the current stream, as internal::reduce_into does on the host (bool:
  // sum and max are "or", product and min are "and").
  static void reduce_device(const Tensor& acc, const Tensor& x, ReduceOp op) {
    if (acc.dtype() == DType::kBool) {
      op = op == ReduceOp::kProduct || op == ReduceOp::kMin ? ReduceOp::kMin : ReduceOp::kMax;
    }
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        add_(acc, x);
        return;
      case ReduceOp::kMax:
        copy_(acc, maximum(acc, x));
        return;
      case ReduceOp::kMin:
        copy_(acc, minimum(acc, x));
        return;
      case ReduceOp::kProduct:
        copy_(acc, mul(acc, x));
        return;
    }
  }

  // kAvg's division, rounded as internal::divide_by rounds; integers divide on the host (no
  // tensor op divides integers as integers).
  void average_device(const Tensor& acc) const {
    if (acc.dtype() == DType::kBool || acc.numel() == 0) return;
    if (is_floating(acc.dtype())) {
      copy_(acc, div(acc, static_cast<double>(size())));
      return;
    }
    Tensor host = contiguous(to(acc, Device::cpu()));  // waits for this rank's stream
    internal::divide_by(host.dtype(), host.data_ptr(), host.numel(), size());
    copy_(acc, host);
  }

  void device_all_reduce(const Tensor& tensor, ReduceOp op, const OpContext& ctx) {
    const Device device = tensor.device();
    const Tensor out = view(detach(tensor), {tensor.numel()});
    {
      // The tensor is both input and output: post a private copy, made on this rank's stream.
      StreamGuard on_stream(begin_on_stream(device, ctx));
      NoGradGuard no_grad;
      post_device(ctx, clone(out));
    }
    exchange(ctx, "all_reduce", [&] {
      if (out.numel() == 0) return;
      copy_(out, posted(0, device));
      for (int r = 1; r < size(); ++r) reduce_device(out, posted(r, device), op);
      if (op == ReduceOp::kAvg) average_device(out);
    });
  }

  void device_broadcast(const Tensor& tensor, int root, const OpContext& ctx) {
    const Device device = tensor.device();
    const Tensor t = view(detach(tensor), {tensor.numel()});
    begin_on_stream(device, ctx);
    post_device(ctx, t);
    exchange(ctx, "broadcast", [&] {
      if (rank_ != root) copy_(t, posted(root, device));
    });
  }

  void device_all_gather(const Tensor& input, const Tensor& output, std::span<const int64_t> counts,
                         const OpContext& ctx) {
    const Device device = output.device();
    const Tensor out = view(detach(output), {output.numel()});
    begin_on_stream(device, ctx);
    post_device(ctx, detach(input));
    exchange(ctx, "all_gather", [&] {
      int64_t at = 0;
      for (int r = 0; r < size(); ++r) {
        if (counts[r] > 0) copy_(narrow(out, 0, at, counts[r]), posted(r, device));
        at += counts[r];
      }
    });
  }

  void device_reduce_scatter(const Tensor& input, const Tensor& output,
                             std::span<const int64_t> counts, ReduceOp op, const OpContext& ctx) {
    const Device device = output.device();
    const Tensor out = view(detach(output), {output.numel()});
    begin_on_stream(device, ctx);
    post_device(ctx, detach(input));
    exchange(ctx, "reduce_scatter", [&] {
      const int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank_, int64_t{0});
      const int64_t n = counts[rank_];
      if (n == 0) return;
      copy_(out, narrow(posted(0, device), 0, offset, n));
      for (int r = 1; r < size(); ++r) {
        reduce_device(out, narrow(posted(r, device), 0, offset, n), op);
      }
      if (op == ReduceOp::kAvg) average_device(out);
    });
  }

  void device_all_to_all(const Tensor& input, const Tensor& output,
                         std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts,
                         const OpContext& ctx) {
    const Device device = output.device();
    const Tensor out = view(detach(output), {output.numel()});
    begin_on_stream(device, ctx);
    post_device(ctx, detach(input), send_counts);
    exchange(ctx, "all_to_all", [&] {
      int64_t at = 0;
      for (int r = 0; r < size(); ++r) {
        const int64_t offset = send_offset(shared_->posts[r], r, recv_counts[r]);
        if (recv_counts[r] > 0) {
          copy_(narrow(out, 0, at, recv_counts[r]),
                narrow(posted(r, device), 0, offset, recv_counts[r]));
        }
        at += recv_counts[r];
      }
    });
  }

  // send: a copy of the tensor, complete before it is posted (the receiver reads it on its own
  // stream whenever it comes).
  Tensor device_copy_for_send(const Tensor& tensor, const OpContext& ctx) {
    const Stream stream = begin_on_stream(tensor.device(), ctx);
    Tensor copy;
    {
      StreamGuard on_stream(stream);
      NoGradGuard no_grad;
      copy = clone(detach(tensor));
    }
    stream.synchronize();
    return copy;
  }

  void device_receive(const Tensor& tensor, const Tensor& message, int peer, int tag,
                      const OpContext& ctx) {
    TESSEL_CHECK(message.dtype() == tensor.dtype() && message.numel() == tensor.numel(),
                 InvalidArgument, "recv from rank {} tag {}: the message is {}, the tensor {}",
                 peer, tag, message.str(), tensor.str());
    const Stream stream = begin_on_stream(tensor.device(), ctx);
    {
      StreamGuard on_stream(stream);
      NoGradGuard no_grad;
      copy_(view(detach(tensor), {tensor.numel()}), view(message, {message.numel()}));
    }
    stream.synchronize();
  }

  std::shared_ptr<Shared> shared_;
  const int rank_;
  // This rank's stream for device tensors (made on first use; the backend is driven by one
  // thread at a time).
  std::optional<Stream> stream_;
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
