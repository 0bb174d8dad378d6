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
#include "tessel/collectives/gloo/internal/pairwise_exchange.h"
#include "tessel/collectives/gloo/internal/reduce_scatter.h"
#include "tessel/collectives/internal/reduce.h"
#include "tessel/store/network_interface.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

using Millis = std::chrono::milliseconds;

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

// Slots of send/recv: a prefix and the tag (the reduce-scatter and pairwise-exchange slots,
// 0x7d and 0x7c, and the shared-memory set-up, 0x7b, are in internal/).
constexpr uint64_t kP2pSlotPrefix = uint64_t{0x7e} << 56;

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
        exchange_(context_, std::move(shm)) {}

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
    gloo_call("all_reduce", [&] { exchange_.run(inputs, outputs, ctx.seq, ctx.timeout, phases); });
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
      gloo_call("all_gather", [&] { exchange_.run(inputs, outputs, ctx.seq, ctx.timeout); });
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
  // the buffer per rank, half of what an all_reduce moves. Where ranks of the group share a host,
  // pairwise exchanges instead (internal/reduce_scatter_exchange.cc).
  void reduce_scatter(const Tensor& input, Tensor& output, std::span<const int64_t> counts,
                      ReduceOp op, const OpContext& ctx) override {
    const int n = size();
    internal::ScatterPlan plan;
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
        internal::reduce_scatter_halving(*context_, plan, scratch_, ctx.seq, deadline);
      } else {
        internal::reduce_scatter_ring(*context_, plan, scratch_, ctx.seq, deadline);
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
    gloo_call("all_to_all", [&] { exchange_.run(inputs, outputs, ctx.seq, ctx.timeout); });
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
  // Whether the group's collectives go through the pairwise exchange's shared memory: some pair of
  // its ranks shares a host. The group's answer, the same on every rank, so all take the same
  // algorithm; settles the pairs in the group's first call (collective then).
  bool use_shared_memory(const char* what, const OpContext& ctx) {
    if (size() == 1) return false;
    bool local = false;
    gloo_call(what, [&] { local = exchange_.group_may_share_memory(ctx.seq, ctx.timeout); });
    return local;
  }

  // Reduce-scatter as pairwise exchanges (internal/reduce_scatter.h), Gloo's errors translated
  // as `what`. Returns the number of phases used.
  uint32_t reduce_scatter_exchange(const Tensor& flat_in, std::span<const int64_t> counts,
                                   const Tensor& out, ReduceOp op, const OpContext& ctx,
                                   const char* what) {
    uint32_t phases = 0;
    gloo_call(what, [&] {
      phases = internal::reduce_scatter_exchange(exchange_, rank(), size(), flat_in, counts, out,
                                                 op, ctx.seq, ctx.timeout, exchange_scratch_bytes_);
    });
    return phases;
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

  std::shared_ptr<tessel::Store> store_;
  std::shared_ptr<::gloo::Context> context_;
  std::shared_ptr<::gloo::transport::Device> device_;
  const size_t halving_max_bytes_;
  const size_t exchange_scratch_bytes_;
  const internal::SharedMemoryOptions shm_;
  internal::ScatterScratch scratch_;  // the ring's and halving's, kept between calls
  internal::PairwiseExchange exchange_;
};

}  // namespace

bool gloo::is_available() { return true; }

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

std::shared_ptr<ProcessGroup> gloo::create_process_group(std::shared_ptr<Store> store, int rank,
                                                         int size, GlooOptions options) {
  TESSEL_CHECK(store != nullptr, InvalidArgument, "gloo::create_process_group: store is null");
  TESSEL_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
               "gloo::create_process_group: rank {} is not in a world of size {}", rank, size);
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
              .host_id = options.host_id,
              .local_world_size = options.local_world_size}),
      options.group, std::move(ranks));
}

}  // namespace tessel
