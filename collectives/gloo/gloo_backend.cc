#include "tessel/collectives/gloo/gloo_backend.h"

#include <signal.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "tessel/base/clock.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/backend.h"
#include "tessel/collectives/internal/reduce.h"

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
    if (text.find("Timed out") != std::string::npos || text.find("timed out") != std::string::npos) {
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
    case DType::kF32: return f(float{});
    case DType::kI64: return f(int64_t{});
    case DType::kI32: return f(int32_t{});
    case DType::kBF16:
    case DType::kF16: return f(uint16_t{});
    case DType::kBool: return f(uint8_t{});
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
// Slots of our ring reduce-scatter: prefix, 40 bits of the group sequence number, 16 of step.
constexpr uint64_t kReduceScatterSlotPrefix = uint64_t{0x7d} << 56;

class GlooBackend final : public Backend {
 public:
  GlooBackend(std::shared_ptr<tessel::Store> store, std::shared_ptr<::gloo::Context> context,
              std::shared_ptr<::gloo::transport::Device> device)
      : store_(std::move(store)), context_(std::move(context)), device_(std::move(device)) {}

  std::string_view name() const override { return "gloo"; }
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  void all_reduce(Tensor& tensor, ReduceOp op, const OpContext& ctx) override {
    all_reduce_raw(tensor.data_ptr(), tensor.numel(), tensor.dtype(), op, ctx);
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

  // A ring reduce-scatter over Gloo's point-to-point buffers (Gloo's collectives API has none):
  // n - 1 steps; in each, a rank passes one chunk's partial sum to its right neighbour and adds
  // its own input to the chunk arriving from its left, so after the last step it holds the full
  // sum of its own chunk. Each rank moves (n-1)/n of the buffer (an all_reduce moves twice that)
  // and needs three chunks of scratch, not a copy of the input.
  void reduce_scatter(const Tensor& input, Tensor& output, std::span<const int64_t> counts,
                      ReduceOp op, const OpContext& ctx) override {
    const int n = size(), r = rank();
    const size_t es = input.element_size();
    const auto* in = static_cast<const uint8_t*>(input.data_ptr());
    std::vector<size_t> offset(static_cast<size_t>(n) + 1, 0);  // in bytes
    size_t max_chunk = 0;
    for (int c = 0; c < n; ++c) {
      const size_t bytes = static_cast<size_t>(counts[static_cast<size_t>(c)]) * es;
      offset[static_cast<size_t>(c) + 1] = offset[static_cast<size_t>(c)] + bytes;
      max_chunk = std::max(max_chunk, bytes);
    }
    auto bytes_of = [&](int c) { return offset[c + 1] - offset[c]; };
    if (n == 1) {
      if (output.nbytes() > 0) std::memcpy(output.data_ptr(), in, output.nbytes());
      return;
    }
    const ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    // [received chunk][partial A][partial B]: a partial is sent while the next is computed.
    uint8_t* scratch = scratch_for(3 * std::max<size_t>(max_chunk, 1));
    uint8_t* received = scratch;
    uint8_t* partial[2] = {scratch + max_chunk, scratch + 2 * max_chunk};
    const Deadline deadline = Deadline::after(ctx.timeout);
    gloo_call("reduce_scatter", [&] {
      // Gloo only reads what it sends; the input is not written.
      uint8_t dummy = 0;
      auto input_buffer = context_->createUnboundBuffer(
          input.nbytes() > 0 ? const_cast<uint8_t*>(in) : &dummy,
          std::max<size_t>(input.nbytes(), 1));
      auto scratch_buffer = context_->createUnboundBuffer(scratch, scratch_bytes_);
      for (int step = 0; step < n - 1; ++step) {
        // Chunk indices so that the last chunk summed at rank r is chunk r.
        const int send_chunk = ((r - step - 1) % n + n) % n;
        const int recv_chunk = ((r - step - 2) % n + n) % n;
        const uint64_t slot = kReduceScatterSlotPrefix | ((ctx.seq & 0xffffffffffull) << 16) |
                              static_cast<uint64_t>(step);
        const size_t send_bytes = bytes_of(send_chunk), recv_bytes = bytes_of(recv_chunk);
        if (send_bytes > 0) {
          if (step == 0) {
            input_buffer->send(right, slot, offset[send_chunk], send_bytes);
          } else {
            scratch_buffer->send(right, slot, partial[(step - 1) % 2] - scratch, send_bytes);
          }
        }
        if (recv_bytes > 0) {
          scratch_buffer->recv(left, slot, 0, recv_bytes);
          if (!scratch_buffer->waitRecv(to_millis(deadline.remaining()))) {
            throw CommError("reduce_scatter: the receive was aborted");
          }
          uint8_t* sum = step == n - 2 ? static_cast<uint8_t*>(output.data_ptr())
                                       : partial[step % 2];
          internal::reduce_pair(input.dtype(), base, sum, received, in + offset[recv_chunk],
                                static_cast<int64_t>(recv_bytes / es));
        }
        if (send_bytes > 0) {
          auto& sent = step == 0 ? input_buffer : scratch_buffer;
          if (!sent->waitSend(to_millis(deadline.remaining()))) {
            throw CommError("reduce_scatter: the send was aborted");
          }
        }
      }
    });
    if (op == ReduceOp::kAvg && output.numel() > 0) {
      internal::divide_by(output.dtype(), output.data_ptr(), output.numel(), n);
    }
  }

  void all_to_all(const Tensor& input, Tensor& output, std::span<const int64_t> send_counts,
                  std::span<const int64_t> recv_counts, const OpContext& ctx) override {
    const int64_t es = static_cast<int64_t>(input.element_size());
    std::vector<int64_t> send_bytes, recv_bytes;
    for (int64_t c : send_counts) send_bytes.push_back(c * es);
    for (int64_t c : recv_counts) recv_bytes.push_back(c * es);
    uint8_t dummy_in = 0, dummy_out = 0;
    ::gloo::AlltoallvOptions o(context_);
    o.setInput(input.nbytes() ? static_cast<uint8_t*>(input.data_ptr()) : &dummy_in, send_bytes);
    o.setOutput(output.nbytes() ? static_cast<uint8_t*>(output.data_ptr()) : &dummy_out,
                recv_bytes);
    o.setTag(static_cast<uint32_t>(ctx.seq));
    o.setTimeout(to_millis(ctx.timeout));
    gloo_call("all_to_all", [&] { ::gloo::alltoallv(o); });
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

  std::unique_ptr<Backend> split(const SplitRequest& request) override {
    if (request.color == kNoColor) return nullptr;
    auto store = std::make_shared<PrefixStore>(fmt::format("gloo/{}", request.options.id),
                                               store_);
    auto context = connect(store, request.new_rank, static_cast<int>(request.members.size()),
                           request.options.timeout, device_);
    return std::make_unique<GlooBackend>(std::move(store), std::move(context), device_);
  }

 private:
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

  // Scratch memory of at least `bytes`, kept between calls: calls on a backend never overlap
  // (its group runs one at a time), and a fresh allocation per call page-faults (measured: a
  // quarter of a 4 MiB reduce_scatter).
  uint8_t* scratch_for(size_t bytes) {
    if (bytes > scratch_bytes_) {
      scratch_.reset(new uint8_t[bytes]);  // default-initialized: no zero fill
      scratch_bytes_ = bytes;
    }
    return scratch_.get();
  }

  std::shared_ptr<tessel::Store> store_;
  std::shared_ptr<::gloo::Context> context_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::unique_ptr<uint8_t[]> scratch_;
  size_t scratch_bytes_ = 0;
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
      std::make_unique<GlooBackend>(std::move(prefixed), std::move(context), std::move(device)),
      options.group, std::move(ranks));
}

}  // namespace tessel
