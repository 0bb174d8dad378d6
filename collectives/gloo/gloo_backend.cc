#include "tessel/collectives/gloo/gloo_backend.h"

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "tessel/base/clock.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/comm_backend.h"
#include "tessel/collectives/internal/gloo_all_to_all.h"
#include "tessel/collectives/internal/reduce.h"
#include "tessel/store/network_interface.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

using Millis = std::chrono::milliseconds;

// Rounds of a reduce-scatter exchange at most: with all_reduce's gather, phases 0 to 255.
constexpr int64_t kMaxRounds = 255;

Millis to_millis(Nanoseconds d) {
  return std::max(Millis(1), std::chrono::duration_cast<Millis>(d));
}

// Gloo's rendezvous store interface over ours.
class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<tessel::Store> store, Nanoseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_->get(key, timeout_);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<tessel::Store> store_;
  Nanoseconds timeout_;
};

// Runs a Gloo call, turning its exceptions into ours (with Gloo's text).
template <typename F>
void gloo_call(std::string_view what, F&& f) {
  try {
    f();
  } catch (const ::gloo::IoException& e) {
    const std::string text = e.what();
    if (text.find("Timed out") != std::string::npos ||
        text.find("timed out") != std::string::npos) {
      throw Timeout(fmt::format("gloo {}: {}", what, text));
    }
    if (text.find("closed") != std::string::npos || text.find("reset") != std::string::npos ||
        text.find("Broken pipe") != std::string::npos || text.find("EOF") != std::string::npos) {
      throw PeerLost(fmt::format("gloo {}: a peer went away: {}", what, text));
    }
    throw CommError(fmt::format("gloo {}: {}", what, text));
  } catch (const ::gloo::Exception& e) {
    throw CommError(fmt::format("gloo {}: {}", what, e.what()));
  } catch (const ::gloo::EnforceNotMet& e) {
    throw CommError(fmt::format("gloo {}: {}", what, e.what()));
  }
}

// Gloo collectives pick buffer element types by template; bytes suffice for data movement and
// element-typed pointers are given to reductions through the reduce function.
template <typename F>
void with_element_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kI64:
      return f(int64_t{});
    case DType::kI32:
      return f(int32_t{});
    case DType::kBF16:
    case DType::kF16:
      return f(uint16_t{});
    case DType::kBool:
      return f(uint8_t{});
  }
}

std::shared_ptr<::gloo::transport::Device> make_device(const GlooOptions& options) {
  ::gloo::transport::tcp::attr attr;
  std::string iface = options.iface;
  if (iface.empty() && options.hostname.empty()) iface = env_string(EnvKnob::kGlooIface);
  if (!iface.empty()) {
    attr.iface = iface;
  } else if (!options.hostname.empty()) {
    attr.hostname = options.hostname;
  } else if (const std::string store = env_string(EnvKnob::kStoreAddr); !store.empty()) {
    // The address that reaches the job's store reaches the other ranks too (the host name may
    // resolve to loopback, as 127.0.1.1 does on Debian).
    attr.hostname = network_route_to(endpoint_host(store)).address;
  } else {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0) throw_system_error("gethostname", errno);
    attr.hostname = host;
  }
  std::shared_ptr<::gloo::transport::Device> device;
  gloo_call("create device", [&] { device = ::gloo::transport::tcp::CreateDevice(attr); });
  return device;
}

std::shared_ptr<::gloo::Context> connect(std::shared_ptr<tessel::Store> store, int rank, int size,
                                         Nanoseconds timeout,
                                         std::shared_ptr<::gloo::transport::Device>& device) {
  GlooStoreAdapter adapter(std::move(store), timeout);
  auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  context->setTimeout(to_millis(timeout));
  gloo_call("connect", [&] { context->connectFullMesh(adapter, device); });
  return context;
}

constexpr uint64_t kP2pSlotPrefix = uint64_t{0x7e} << 56;
// Slots of our reduce-scatter: prefix, 40 bits of the group sequence number, 16 of the step.
constexpr uint64_t kReduceScatterSlotPrefix = uint64_t{0x7d} << 56;

class GlooBackend final : public CommBackend {
 public:
  GlooBackend(std::shared_ptr<tessel::Store> store, std::shared_ptr<::gloo::Context> context,
              std::shared_ptr<::gloo::transport::Device> device, size_t halving_max_bytes,
              size_t exchange_scratch_bytes, internal::SharedMemoryOptions shm)
      : store_(std::move(store)),
        context_(std::move(context)),
        device_(std::move(device)),
        halving_max_bytes_(halving_max_bytes),
        exchange_scratch_bytes_(std::max<size_t>(exchange_scratch_bytes, 1)),
        shm_(shm),
        all_to_all_(context_, std::move(shm)) {}

  std::string_view name() const override { return "gloo"; }
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  // Where ranks of the group share a host: a reduce-scatter and an all_gather, both as
  // exchanges (all_to_all) through shared memory with those ranks and TCP with the rest; every
  // chunk is reduced once, in rank order, so all ranks get the same bits. Otherwise Gloo's
  // ring all-reduce.
  void all_reduce(Tensor& tensor, ReduceOp op, const OpContext& ctx) override {
    if (tensor.numel() == 0) return;
    if (!use_shared_memory("all_reduce", ctx)) {
      all_reduce_raw(tensor.data_ptr(), tensor.numel(), tensor.dtype(), op, ctx);
      return;
    }
    const int n = size(), me = rank();
    const int64_t total = tensor.numel();
    std::vector<int64_t> counts, offsets;
    for (int64_t j = 0, at = 0; j < n; ++j) {
      counts.push_back(total / n + (j < total % n ? 1 : 0));
      offsets.push_back(at);
      at += counts.back();
    }
    const Tensor flat = view(tensor, {total});
    const ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const uint32_t phases = reduce_scatter_exchange(
        flat, counts, narrow(flat, 0, offsets[me], counts[me]), base, ctx, "all_reduce");
    std::vector<Tensor> inputs, outputs;
    for (int j = 0; j < n; ++j) {
      const bool own = j == me;  // already in place
      inputs.push_back(narrow(flat, 0, offsets[me], own ? 0 : counts[me]));
      outputs.push_back(narrow(flat, 0, offsets[j], own ? 0 : counts[j]));
    }
    gloo_call("all_reduce",
              [&] { all_to_all_.run(inputs, outputs, ctx.seq, ctx.timeout, phases); });
    if (op == ReduceOp::kAvg) internal::divide_by(tensor.dtype(), tensor.data_ptr(), total, n);
  }

  void broadcast(Tensor& tensor, int root, const OpContext& ctx) override {
    if (tensor.nbytes() == 0) return;
    ::gloo::BroadcastOptions o(context_);
    o.setOutput(static_cast<uint8_t*>(tensor.data_ptr()), tensor.nbytes());
    o.setRoot(root);
    o.setTag(static_cast<uint32_t>(ctx.seq));
    o.setTimeout(to_millis(ctx.timeout));
    gloo_call("broadcast", [&] { ::gloo::broadcast(o); });
  }

  void all_gather(const Tensor& input, Tensor& output, std::span<const int64_t> counts,
                  const OpContext& ctx) override {
    if (output.nbytes() == 0) return;
    // When ranks of the group share a host, an all_to_all of the input to every rank into the
    // output's slices: through shared memory between those, over TCP otherwise.
    if (use_shared_memory("all_gather", ctx)) {
      const Tensor flat_in = view(input, {input.numel()});
      const Tensor flat_out = view(output, {output.numel()});
      std::vector<Tensor> inputs(static_cast<size_t>(size()), flat_in), outputs;
      int64_t at = 0;
      for (int64_t c : counts) {
        outputs.push_back(narrow(flat_out, 0, at, c));
        at += c;
      }
      gloo_call("all_gather", [&] { all_to_all_.run(inputs, outputs, ctx.seq, ctx.timeout); });
      return;
    }
    const bool even =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    if (even) {
      ::gloo::AllgatherOptions o(context_);
      o.setInput(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
      o.setOutput(static_cast<uint8_t*>(output.data_ptr()), output.nbytes());
      o.setTag(static_cast<uint32_t>(ctx.seq));
      o.setTimeout(to_millis(ctx.timeout));
      gloo_call("all_gather", [&] { ::gloo::allgather(o); });
      return;
    }
    std::vector<size_t> bytes;
    for (int64_t c : counts) bytes.push_back(static_cast<size_t>(c) * input.element_size());
    ::gloo::AllgathervOptions o(context_);
    // Gloo wants a valid pointer even for a rank contributing nothing.
    uint8_t dummy = 0;
    auto* in = input.nbytes() ? static_cast<uint8_t*>(input.data_ptr()) : &dummy;
    o.setInput(in, input.nbytes());
    o.setOutput(static_cast<uint8_t*>(output.data_ptr()), bytes);
    o.setTag(static_cast<uint32_t>(ctx.seq));
    o.setTimeout(to_millis(ctx.timeout));
    gloo_call("all_gather", [&] { ::gloo::allgatherv(o); });
  }

  // Gloo's collectives API has no reduce-scatter, so ours runs over its point-to-point buffers:
  // recursive halving (log2 n steps) for a power-of-two group and an input of at most
  // GlooOptions::halving_max_bytes, where latency matters; a ring (n - 1 steps, three chunks of
  // scratch) otherwise, where bandwidth decides and the scratch stays small. Both move (n-1)/n of
  // the buffer per rank, half of what an all_reduce moves.
  void reduce_scatter(const Tensor& input, Tensor& output, std::span<const int64_t> counts,
                      ReduceOp op, const OpContext& ctx) override {
    const int n = size();
    ScatterPlan plan;
    plan.in = static_cast<const uint8_t*>(input.data_ptr());
    plan.out = static_cast<uint8_t*>(output.data_ptr());
    plan.dtype = input.dtype();
    plan.op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    plan.offset.assign(static_cast<size_t>(n) + 1, 0);
    for (int c = 0; c < n; ++c) {
      plan.offset[static_cast<size_t>(c) + 1] =
          plan.offset[static_cast<size_t>(c)] +
          static_cast<size_t>(counts[static_cast<size_t>(c)]) * input.element_size();
    }
    if (n == 1) {
      if (output.nbytes() > 0) std::memcpy(output.data_ptr(), plan.in, output.nbytes());
      return;
    }
    if (use_shared_memory("reduce_scatter", ctx)) {
      reduce_scatter_exchange(view(input, {input.numel()}), counts, output, plan.op, ctx,
                              "reduce_scatter");
      if (op == ReduceOp::kAvg && output.numel() > 0) {
        internal::divide_by(output.dtype(), output.data_ptr(), output.numel(), n);
      }
      return;
    }
    const Deadline deadline = Deadline::after(ctx.timeout);
    gloo_call("reduce_scatter", [&] {
      if ((n & (n - 1)) == 0 && plan.offset.back() <= halving_max_bytes_) {
        reduce_scatter_halving(plan, ctx.seq, deadline);
      } else {
        reduce_scatter_ring(plan, ctx.seq, deadline);
      }
    });
    if (op == ReduceOp::kAvg && output.numel() > 0) {
      internal::divide_by(output.dtype(), output.data_ptr(), output.numel(), n);
    }
  }

  // Rank j's slice of each tensor as a 1-D view, through the list form's algorithm.
  void all_to_all(const Tensor& input, Tensor& output, std::span<const int64_t> send_counts,
                  std::span<const int64_t> recv_counts, const OpContext& ctx) override {
    auto slices = [](const Tensor& t, std::span<const int64_t> counts) {
      const Tensor flat = view(t, {t.numel()});
      std::vector<Tensor> out;
      int64_t at = 0;
      for (int64_t c : counts) {
        out.push_back(narrow(flat, 0, at, c));
        at += c;
      }
      return out;
    };
    all_to_all_views(slices(input, send_counts), slices(output, recv_counts), ctx);
  }

  void all_to_all_views(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                        const OpContext& ctx) override {
    gloo_call("all_to_all", [&] { all_to_all_.run(inputs, outputs, ctx.seq, ctx.timeout); });
  }

  void send(const Tensor& tensor, int peer, int tag, const OpContext& ctx) override {
    uint8_t dummy = 0;
    void* p = tensor.nbytes() ? tensor.data_ptr() : &dummy;
    gloo_call("send", [&] {
      auto buffer = context_->createUnboundBuffer(p, tensor.nbytes());
      buffer->send(peer, kP2pSlotPrefix | static_cast<uint32_t>(tag));
      buffer->waitSend(to_millis(ctx.timeout));
    });
  }

  void recv(Tensor& tensor, int peer, int tag, const OpContext& ctx) override {
    uint8_t dummy = 0;
    void* p = tensor.nbytes() ? tensor.data_ptr() : &dummy;
    gloo_call("recv", [&] {
      auto buffer = context_->createUnboundBuffer(p, tensor.nbytes());
      buffer->recv(peer, kP2pSlotPrefix | static_cast<uint32_t>(tag));
      buffer->waitRecv(to_millis(ctx.timeout));
    });
  }

  void barrier(const OpContext& ctx) override {
    ::gloo::BarrierOptions o(context_);
    o.setTag(static_cast<uint32_t>(ctx.seq));
    o.setTimeout(to_millis(ctx.timeout));
    gloo_call("barrier", [&] { ::gloo::barrier(o); });
  }

  std::unique_ptr<CommBackend> split(const SplitRequest& request) override {
    if (request.color == kNoColor) return nullptr;
    auto store = std::make_shared<PrefixStore>(fmt::format("gloo/{}", request.options.id), store_);
    auto context = connect(store, request.new_rank, static_cast<int>(request.members.size()),
                           request.options.timeout, device_);
    return std::make_unique<GlooBackend>(std::move(store), std::move(context), device_,
                                         halving_max_bytes_, exchange_scratch_bytes_, shm_);
  }

 private:
  // Whether the group's collectives go through all_to_all's shared memory: some pair of its
  // ranks shares a host. The group's answer, the same on every rank, so all take the same
  // algorithm; settles the pairs in the group's first call (collective then).
  bool use_shared_memory(const char* what, const OpContext& ctx) {
    if (size() == 1) return false;
    bool local = false;
    gloo_call(what, [&] { local = all_to_all_.group_may_share_memory(ctx.seq, ctx.timeout); });
    return local;
  }

  // Reduce-scatter as an exchange: chunk j of every rank's `flat_in` goes to rank j, which
  // reduces the pieces in rank order into `out` (a 1-D contiguous tensor of counts[rank]
  // elements, which may be this rank's own chunk of flat_in: all_reduce's first half). The
  // peers' pieces are held in scratch of about GlooOptions::exchange_scratch_bytes: larger
  // chunks go in rounds (one exchange each, phases 0, 1, ...), every rank cutting them alike.
  // Returns the number of phases used.
  uint32_t reduce_scatter_exchange(const Tensor& flat_in, std::span<const int64_t> counts,
                                   const Tensor& out, ReduceOp op, const OpContext& ctx,
                                   const char* what) {
    const int n = size(), me = rank();
    const DType dtype = flat_in.dtype();
    const auto element = static_cast<int64_t>(dtype_size(dtype));
    const int64_t mine = counts[static_cast<size_t>(me)];
    const int64_t longest = *std::max_element(counts.begin(), counts.end());
    // Elements of each chunk per round: what fits the scratch, and few enough rounds that the
    // phases (all_reduce adds one) stay within a call id's 8 bits.
    const int64_t per_round =
        std::max<int64_t>({static_cast<int64_t>(exchange_scratch_bytes_) / ((n - 1) * element),
                           (longest + kMaxRounds - 1) / kMaxRounds, 1});
    const auto rounds =
        static_cast<uint32_t>(std::max<int64_t>(1, (longest + per_round - 1) / per_round));
    Tensor pieces = empty({(n - 1) * std::min(mine, per_round)}, dtype);
    std::vector<int64_t> offsets;
    for (int64_t j = 0, at = 0; j < n; at += counts[static_cast<size_t>(j)], ++j) {
      offsets.push_back(at);
    }
    std::vector<uint8_t> own_copy;
    for (uint32_t round = 0; round < rounds; ++round) {
      const int64_t lo = static_cast<int64_t>(round) * per_round;
      auto piece_of = [&](int j) {  // [first, length) of chunk j in this round
        const int64_t c = counts[static_cast<size_t>(j)];
        const int64_t first = std::min(lo, c);
        return std::pair{first, std::min(lo + per_round, c) - first};
      };
      const auto [first, len] = piece_of(me);
      std::vector<Tensor> inputs, outputs;
      for (int j = 0, slot = 0; j < n; ++j) {
        const auto [f, l] = piece_of(j);
        const bool own = j == me;  // reduced straight from the input
        inputs.push_back(narrow(flat_in, 0, offsets[static_cast<size_t>(j)] + f, own ? 0 : l));
        outputs.push_back(narrow(pieces, 0, own ? 0 : slot++ * len, own ? 0 : len));
      }
      gloo_call(what, [&] { all_to_all_.run(inputs, outputs, ctx.seq, ctx.timeout, round); });
      if (len == 0) continue;
      // Rank order, a block at a time so the block stays in cache while every piece goes in.
      // The own piece is read from a copy when `out` is where it lies.
      const auto* own = static_cast<const uint8_t*>(flat_in.data_ptr()) +
                        (offsets[static_cast<size_t>(me)] + first) * element;
      const auto* peers = static_cast<const uint8_t*>(pieces.data_ptr());
      auto* result = static_cast<uint8_t*>(out.data_ptr()) + first * element;
      const bool in_place = result == own;
      constexpr int64_t kBlockBytes = 16 << 10;
      const int64_t block = kBlockBytes / element;
      if (in_place) own_copy.resize(kBlockBytes);
      for (int64_t b = 0; b < len; b += block) {
        const int64_t m = std::min(block, len - b);
        if (in_place) {
          std::memcpy(own_copy.data(), own + b * element, static_cast<size_t>(m * element));
        }
        auto piece = [&](int j) -> const void* {
          if (j == me) return in_place ? own_copy.data() : own + b * element;
          return peers + ((j < me ? j : j - 1) * len + b) * element;
        };
        uint8_t* o = result + b * element;
        internal::reduce_pair(dtype, op, o, piece(0), piece(1), m);
        for (int j = 2; j < n; ++j) internal::reduce_into(dtype, op, o, piece(j), m);
      }
    }
    return rounds;
  }

  void all_reduce_raw(void* data, int64_t n, DType dtype, ReduceOp op, const OpContext& ctx) {
    if (n == 0) return;
    ::gloo::AllreduceOptions o(context_);
    with_element_type(dtype, [&](auto element) {
      using T = decltype(element);
      o.setOutput(static_cast<T*>(data), static_cast<size_t>(n));
    });
    const ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    o.setReduceFunction([dtype, base](void* out, const void* a, const void* b, size_t count) {
      internal::reduce_pair(dtype, base, out, a, b, static_cast<int64_t>(count));
    });
    o.setTag(static_cast<uint32_t>(ctx.seq));
    o.setTimeout(to_millis(ctx.timeout));
    gloo_call("all_reduce", [&] { ::gloo::allreduce(o); });
    if (op == ReduceOp::kAvg) internal::divide_by(dtype, data, n, size());
  }

  // What both reduce-scatter algorithms work from. Chunk c of the input is bytes
  // [offset[c], offset[c + 1]); the result is this rank's chunk, in `out`.
  struct ScatterPlan {
    const uint8_t* in = nullptr;
    uint8_t* out = nullptr;
    DType dtype = DType::kF32;
    ReduceOp op = ReduceOp::kSum;  // avg is summed, then divided by the caller
    std::vector<size_t> offset;
    size_t bytes(int first, int last) const { return offset[last] - offset[first]; }
  };

  static uint64_t scatter_slot(uint64_t seq, int step) {
    return kReduceScatterSlotPrefix | ((seq & 0xffffffffffull) << 16) | static_cast<uint64_t>(step);
  }

  // Gloo only reads what it sends, so the (const) input can be a send buffer.
  std::unique_ptr<::gloo::transport::UnboundBuffer> input_buffer(const ScatterPlan& plan) {
    static uint8_t dummy = 0;
    return context_->createUnboundBuffer(
        plan.offset.back() > 0 ? const_cast<uint8_t*>(plan.in) : &dummy,
        std::max<size_t>(plan.offset.back(), 1));
  }

  // out = a (op) b over `bytes` of the plan's dtype.
  static void combine(const ScatterPlan& plan, uint8_t* out, const uint8_t* a, const uint8_t* b,
                      size_t bytes) {
    const auto count = static_cast<int64_t>(bytes / dtype_size(plan.dtype));
    internal::reduce_pair(plan.dtype, plan.op, out, a, b, count);
  }

  static void wait_recv(::gloo::transport::UnboundBuffer& buffer, const Deadline& deadline) {
    if (!buffer.waitRecv(to_millis(deadline.remaining()))) {
      throw CommError("reduce_scatter: a receive was aborted");
    }
  }
  static void wait_send(::gloo::transport::UnboundBuffer& buffer, const Deadline& deadline) {
    if (!buffer.waitSend(to_millis(deadline.remaining()))) {
      throw CommError("reduce_scatter: a send was aborted");
    }
  }

  // Ring: in step s a rank sends one chunk's partial sum to its right neighbour and adds its
  // own input to the chunk arriving from its left; chunk indices are chosen so that the last
  // chunk it completes is its own.
  void reduce_scatter_ring(const ScatterPlan& plan, uint64_t seq, const Deadline& deadline) {
    const int n = size(), r = rank();
    size_t max_chunk = 0;
    for (int c = 0; c < n; ++c) max_chunk = std::max(max_chunk, plan.bytes(c, c + 1));
    // [received chunk][partial A][partial B]: a partial is sent while the next is computed.
    uint8_t* scratch = scratch_for(3 * std::max<size_t>(max_chunk, 1));
    uint8_t* received = scratch;
    uint8_t* partial[2] = {scratch + max_chunk, scratch + 2 * max_chunk};
    auto from_input = input_buffer(plan);
    auto& work = scratch_buffer_;
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    for (int step = 0; step < n - 1; ++step) {
      const int send_chunk = ((r - step - 1) % n + n) % n;
      const int recv_chunk = ((r - step - 2) % n + n) % n;
      const uint64_t slot = scatter_slot(seq, step);
      const size_t send_bytes = plan.bytes(send_chunk, send_chunk + 1);
      const size_t recv_bytes = plan.bytes(recv_chunk, recv_chunk + 1);
      if (send_bytes > 0) {
        if (step == 0) {
          from_input->send(right, slot, plan.offset[send_chunk], send_bytes);
        } else {
          work->send(right, slot, partial[(step - 1) % 2] - scratch, send_bytes);
        }
      }
      if (recv_bytes > 0) {
        work->recv(left, slot, 0, recv_bytes);
        wait_recv(*work, deadline);
        uint8_t* sum = step == n - 2 ? plan.out : partial[step % 2];
        combine(plan, sum, received, plan.in + plan.offset[recv_chunk], recv_bytes);
      }
      if (send_bytes > 0) wait_send(step == 0 ? *from_input : *work, deadline);
    }
  }

  // Recursive halving (n a power of two): at distance d = n/2, n/4, ..., 1 a rank swaps half of
  // its current chunk range with rank r ^ d (which holds the same range), keeps the half that
  // contains chunk r and adds the partial sums it received to it.
  void reduce_scatter_halving(const ScatterPlan& plan, uint64_t seq, const Deadline& deadline) {
    const int n = size(), r = rank();
    // [partial sums of the kept half][received half], each as large as the larger half; the
    // partial sums are addressed relative to the first kept chunk (`work_base`).
    const size_t half = std::max(plan.bytes(0, n / 2), plan.bytes(n / 2, n));
    uint8_t* scratch = scratch_for(2 * std::max<size_t>(half, 1));
    uint8_t* received = scratch + half;
    auto from_input = input_buffer(plan);
    auto& work = scratch_buffer_;
    const size_t work_base = plan.offset[(r & (n / 2)) != 0 ? n / 2 : 0];
    int lo = 0, hi = n, step = 0;
    bool sums_in_work = false;  // false: the current partial sums are the input itself
    for (int d = n / 2; d >= 1; d /= 2, ++step) {
      const int mid = lo + d;
      const bool upper = (r & d) != 0;
      const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
      const int partner = r ^ d;
      const uint64_t slot = scatter_slot(seq, step);
      const size_t give_bytes = plan.bytes(give_lo, give_hi);
      const size_t keep_bytes = plan.bytes(keep_lo, keep_hi);
      if (give_bytes > 0) {
        if (sums_in_work) {
          work->send(partner, slot, plan.offset[give_lo] - work_base, give_bytes);
        } else {
          from_input->send(partner, slot, plan.offset[give_lo], give_bytes);
        }
      }
      if (keep_bytes > 0) {
        work->recv(partner, slot, received - scratch, keep_bytes);
        wait_recv(*work, deadline);
        const uint8_t* mine = sums_in_work ? scratch + (plan.offset[keep_lo] - work_base)
                                           : plan.in + plan.offset[keep_lo];
        uint8_t* sum = d == 1 ? plan.out : scratch + (plan.offset[keep_lo] - work_base);
        combine(plan, sum, received, mine, keep_bytes);
      }
      if (give_bytes > 0) wait_send(sums_in_work ? *work : *from_input, deadline);
      sums_in_work = true;
      lo = keep_lo;
      hi = keep_hi;
    }
  }

  // Scratch memory of at least `bytes`, kept between calls: calls on a backend never overlap
  // (its group runs one at a time), and a fresh allocation per call page-faults (measured: a
  // quarter of a 4 MiB reduce_scatter).
  // Its Gloo buffer (scratch_buffer_) is kept with it.
  uint8_t* scratch_for(size_t bytes) {
    if (bytes > scratch_bytes_) {
      scratch_buffer_.reset();
      scratch_.reset(new uint8_t[bytes]);  // default-initialized: no zero fill
      scratch_bytes_ = bytes;
      scratch_buffer_ = context_->createUnboundBuffer(scratch_.get(), scratch_bytes_);
    }
    return scratch_.get();
  }

  std::shared_ptr<tessel::Store> store_;
  std::shared_ptr<::gloo::Context> context_;
  std::shared_ptr<::gloo::transport::Device> device_;
  const size_t halving_max_bytes_;
  const size_t exchange_scratch_bytes_;
  const internal::SharedMemoryOptions shm_;
  std::unique_ptr<uint8_t[]> scratch_;
  size_t scratch_bytes_ = 0;
  std::unique_ptr<::gloo::transport::UnboundBuffer> scratch_buffer_;  // over scratch_
  internal::GlooAllToAll all_to_all_;
};

}  // namespace

bool gloo_is_available() { return true; }

// A write to a peer that died raises SIGPIPE, whose default action kills this (healthy) rank
// silently, with no flight-recorder dump. Ignored, the write fails with EPIPE and Gloo reports
// the lost peer as an error. A handler the program installed is left alone.
static void ignore_sigpipe_if_default() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      !(current.sa_flags & SA_SIGINFO)) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

std::shared_ptr<ProcessGroup> gloo_create_process_group(std::shared_ptr<Store> store, int rank,
                                                        int size, GlooOptions options) {
  TESSEL_CHECK(store != nullptr, InvalidArgument, "gloo_create_process_group: store is null");
  TESSEL_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
               "gloo_create_process_group: rank {} is not in a world of size {}", rank, size);
  options.group.timeout = resolve_group_timeout(options.group);
  ignore_sigpipe_if_default();
  auto device = make_device(options);
  auto prefixed =
      std::make_shared<PrefixStore>(fmt::format("gloo/{}", options.group.id), std::move(store));
  auto context = connect(prefixed, rank, size, options.group.timeout, device);
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  log_debug(LogComponent::kCollectives, "gloo group '{}' connected: rank {} of {} on {}",
            options.group.name, rank, size, device->str());
  return std::make_shared<ProcessGroup>(
      std::make_unique<GlooBackend>(
          std::move(prefixed), std::move(context), std::move(device), options.halving_max_bytes,
          options.exchange_scratch_bytes,
          internal::SharedMemoryOptions{
              .enabled = options.shared_memory && env_bool(EnvKnob::kGlooShm),
              .host_id = options.host_id}),
      options.group, std::move(ranks));
}

}  // namespace tessel
