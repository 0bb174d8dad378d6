#include "tessel/collectives/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <vector>

#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/comm_backend.h"
#include "tessel/collectives/internal/padded_exchange.h"
#include "tessel/tensor/cuda/cuda_check.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/stream.h"

namespace tessel {
namespace {

void cuda_check(cudaError_t rc, std::string_view call) {
  if (rc == cudaSuccess) return;
  throw CommError(
      fmt::format("{} failed: {} ({})", call, cudaGetErrorString(rc), cudaGetErrorName(rc)));
}

// ncclInProgress is not an error for non-blocking communicators: completion is polled.
void nccl_check(ncclResult_t rc, std::string_view call) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  if (rc == ncclRemoteError) {
    throw PeerLost(
        fmt::format("{} failed: a remote rank failed: {}", call, ncclGetErrorString(rc)));
  }
  throw CommError(
      fmt::format("{} failed: {} (NCCL {})", call, ncclGetErrorString(rc), static_cast<int>(rc)));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI64:
      return ncclInt64;
    case DType::kI32:
      return ncclInt32;
    case DType::kBool:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool) {  // or / and
    return op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kMax ? ncclMax : ncclMin;
  }
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kProduct:
      return ncclProd;
  }
  return ncclSum;
}

// Polls of the device and of peers: 10 us doubling to 1 ms, so short waits stay short and long
// ones (a hung peer) cost no CPU.
Backoff device_backoff() {
  return Backoff(std::chrono::microseconds(10), std::chrono::milliseconds(1));
}

// The one device guard (tensor/cuda/cuda_check.h): restores the previous device only where it
// has a primary context, so the watchdog's thread (which never chose a device) does not create
// a context on GPU 0.
using CudaDeviceGuard = ::tessel::cuda::DeviceGuard;

cudaStream_t native(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}

// The calling thread's current stream on `device`: the registered CUDA runtime's
// (tensor/stream.h) where there is one, else the legacy default stream.
cudaStream_t current_cuda_stream(int device) {
  if (device_count(DeviceType::kCUDA) > device) return native(current_stream(Device::cuda(device)));
  return cudaStreamLegacy;
}

// Owns one non-blocking communicator. Shared by its backend and by the operations in flight on
// it (which poll its asynchronous errors), so it may outlive the backend. Once it failed it is
// aborted, never destroyed. Every use holds the mutex and checks the aborted flag first, and an
// abort raises the flag under the mutex before calling ncclCommAbort outside it: no call reaches
// a communicator an abort freed, and no poll waits for an abort that waits for the device.
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, int device) : comm_(comm), device_(device) {}
  ~NcclComm() {
    if (comm_ == nullptr || aborted_) return;
    try {
      CudaDeviceGuard guard(device_);
      ncclCommDestroy(comm_);
    } catch (const Error& e) {
      log_warn(LogComponent::kCollectives, "NCCL communicator not destroyed: {}", e.what());
    }
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Runs fn(comm) under the lock; CommError naming `what` once the communicator was aborted.
  template <typename F>
  void use(std::string_view what, F&& fn) {
    std::lock_guard lock(mutex_);
    TESSEL_CHECK(!aborted_, CommError, "{}: the NCCL communicator was aborted", what);
    fn(comm_);
  }
  // ncclCommGetAsyncError: ncclSuccess, ncclInProgress (an operation is being enqueued or the
  // communicator made), or the error. CommError once aborted.
  ncclResult_t async_state(std::string_view what) {
    ncclResult_t state = ncclSuccess;
    use(what, [&](ncclComm_t c) {
      nccl_check(ncclCommGetAsyncError(c, &state), "ncclCommGetAsyncError");
    });
    return state;
  }
  // Throws PeerLost or CommError when the transport reported an error; nothing once aborted
  // (the abort's own error is the Work's).
  void check_async(std::string_view what) {
    std::lock_guard lock(mutex_);
    if (aborted_) return;
    ncclResult_t state = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    nccl_check(state, what);
  }
  bool aborted() const {
    std::lock_guard lock(mutex_);
    return aborted_;
  }
  void abort() {
    NcclComm* self = this;
    abort_together(std::span<NcclComm* const>(&self, 1));
  }

  // Aborts every communicator of `comms` not aborted yet inside one ncclGroupStart/ncclGroupEnd:
  // each one's abort flag is raised before any is torn down, so no teardown waits for another
  // communicator's kernel that only its own abort would stop.
  static void abort_together(std::span<NcclComm* const> comms) {
    std::vector<ncclComm_t> live;
    for (NcclComm* c : comms) {
      std::lock_guard lock(c->mutex_);
      if (c->comm_ != nullptr && !c->aborted_) {
        c->aborted_ = true;
        live.push_back(c->comm_);
      }
    }
    if (live.empty()) return;
    // The results are ignored: an abort cannot be undone, and with non-blocking communicators
    // ncclGroupEnd may return ncclInProgress while NCCL frees them in the background.
    ncclGroupStart();
    for (ncclComm_t c : live) ncclCommAbort(c);
    ncclGroupEnd();
  }

 private:
  mutable std::mutex mutex_;
  ncclComm_t comm_;
  const int device_;
  bool aborted_ = false;  // guarded by mutex_
};

// Holds a CUDA event of `device` from the CUDA runtime's pool (tensor/cuda/event_pool.h), so
// a call's start and end events are reused, not created and destroyed per call. Given back
// complete or not: the next user's record replaces what it captured.
class CudaEvent {
 public:
  CudaEvent(int device, bool timing)
      : runtime_(&runtime_for(DeviceType::kCUDA)),
        event_(static_cast<cudaEvent_t>(runtime_->create_event(device, timing))) {}
  ~CudaEvent() { runtime_->destroy_event(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  DeviceRuntime* runtime_;
  cudaEvent_t event_ = nullptr;
};

// Owns a non-blocking stream of the device's highest priority: collectives are short and
// others wait for them.
class CudaStream {
 public:
  explicit CudaStream(int device) : device_(device) {
    CudaDeviceGuard guard(device);
    int least = 0, greatest = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest),
               "cudaDeviceGetStreamPriorityRange");
    cuda_check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
               "cudaStreamCreateWithPriority");
  }
  ~CudaStream() {
    try {
      CudaDeviceGuard guard(device_);
      cudaStreamDestroy(stream_);  // pending work still finishes; CUDA frees the stream after
    } catch (const Error&) {
    }
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  const int device_;
  cudaStream_t stream_ = nullptr;
};

// Communication streams are named to tessel's allocators (Storage::record_stream) with ids
// from 2^48 up, apart from the ids a CUDA runtime gives its own streams.
std::atomic<int64_t> g_next_stream_id{int64_t{1} << 48};

// The device part of one NCCL call: its start and end events on the group's stream, the tensors
// it reads and writes (kept alive until it is done), and the communicator, for its errors.
class NcclDeviceWork final : public DeviceWork {
 public:
  NcclDeviceWork(std::shared_ptr<NcclComm> comm, int device, std::vector<Tensor> tensors)
      : comm_(std::move(comm)),
        device_(device),
        tensors_(std::move(tensors)),
        start_(device, /*timing=*/true),  // the flight recorder's duration
        end_(device, /*timing=*/true) {}

  cudaEvent_t start() const { return start_.get(); }
  cudaEvent_t end() const { return end_.get(); }

  bool query() override {
    CudaDeviceGuard guard(device_);
    const cudaError_t rc = cudaEventQuery(end_.get());
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) cuda_check(rc, "cudaEventQuery");
    // "Not ready" is no error; clear it where the runtime kept it as the thread's last one.
    if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
    // Still running: did the transport fail under it (a peer gone)?
    comm_->check_async("NCCL operation in flight");
    return false;
  }

  void wait_on_current_stream() override {
    CudaDeviceGuard guard(device_);
    cuda_check(cudaStreamWaitEvent(current_cuda_stream(device_), end_.get(), 0),
               "cudaStreamWaitEvent");
  }

  Nanoseconds elapsed() override {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start_.get(), end_.get()), "cudaEventElapsedTime");
    return Nanoseconds(std::llround(static_cast<double>(ms) * 1e6));
  }

 private:
  std::shared_ptr<NcclComm> comm_;
  const int device_;
  std::vector<Tensor> tensors_;
  CudaEvent start_, end_;
};

// Polls until the communicator has no operation in progress, aborting it at the deadline.
void wait_ready(NcclComm& comm, const Deadline& deadline, Nanoseconds timeout,
                std::string_view what) {
  Backoff backoff = device_backoff();
  for (;;) {
    const ncclResult_t state = comm.async_state(what);
    if (state == ncclSuccess) return;
    nccl_check(state, what);
    if (deadline.expired()) {
      comm.abort();
      throw Timeout(fmt::format("NCCL {} did not finish within {}; communicator aborted", what,
                                format_duration(timeout)));
    }
    backoff.pause(deadline);
  }
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

class NcclBackend final : public CommBackend {
 public:
  NcclBackend(std::shared_ptr<NcclComm> comm, int device, int rank, int size, Nanoseconds timeout)
      : comm_(std::move(comm)),
        device_(device),
        rank_(rank),
        size_(size),
        timeout_(timeout),
        stream_(device),
        stream_handle_(Device::cuda(device), g_next_stream_id.fetch_add(1), stream_.get()),
        ready_(device, /*timing=*/false) {
    CudaDeviceGuard guard(device);
    cuda_check(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
  }

  // Lets the group's stream drain first (bounded by the group's timeout), so the tensors of
  // operations still in flight are released after the device is done with them; a stream that
  // does not drain holds a hung call, and the communicator is aborted.
  ~NcclBackend() override {
    try {
      CudaDeviceGuard guard(device_);
      const Deadline deadline = Deadline::after(timeout_);
      Backoff backoff = device_backoff();
      while (cudaStreamQuery(stream_.get()) == cudaErrorNotReady && !comm_->aborted()) {
        if (deadline.expired()) {
          log_warn(LogComponent::kCollectives,
                   "nccl group of rank {}: operations still running after {}; aborting", rank_,
                   format_duration(timeout_));
          comm_->abort();
          break;
        }
        backoff.pause(deadline);
      }
      cudaFree(scratch_);
    } catch (const Error& e) {
      log_warn(LogComponent::kCollectives, "nccl group of rank {}: {}", rank_, e.what());
    }
  }

  std::string_view name() const override { return "nccl"; }
  // Kernels of different communicators on one GPU can wait for each other (and split-shared
  // ones share channels): every rank enqueues in its program's order, on the caller's thread.
  bool issues_in_process_order() const override { return true; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device default_device() const override { return Device::cuda(device_); }
  void check_device(const Tensor& t) const override {
    TESSEL_CHECK(t.device().is_cuda() && t.device().index == device_, InvalidArgument,
                 "the nccl group of rank {} uses cuda:{}, got {}", rank_, device_, t.str());
  }

  void all_reduce(Tensor& t, ReduceOp op, const OpContext& ctx) override {
    run(ctx, "all_reduce", {t}, [&](ncclComm_t c, cudaStream_t s) {
      nccl_check(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                               nccl_type(t.dtype()), nccl_op(t.dtype(), op), c, s),
                 "ncclAllReduce");
    });
  }

  void broadcast(Tensor& t, int root, const OpContext& ctx) override {
    run(ctx, "broadcast", {t}, [&](ncclComm_t c, cudaStream_t s) {
      nccl_check(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, c, s),
                 "ncclBroadcast");
    });
  }

  // Uneven counts (FSDP's flat buffers): one ncclAllGather of max(counts) per rank through a
  // staging buffer (collectives/internal/padded_exchange.h), the result unpacked into `out`.
  void all_gather(const Tensor& in, Tensor& out, std::span<const int64_t> counts,
                  const OpContext& ctx) override {
    const size_t es = in.element_size();
    if (internal::counts_even(counts)) {
      run(ctx, "all_gather", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
        nccl_check(ncclAllGather(in.data_ptr(), out.data_ptr(), counts[0] * es, ncclUint8, c, s),
                   "ncclAllGather");
      });
      return;
    }
    const Staging st = staging_for(counts, in.dtype());
    run(
        ctx, "all_gather", {in, out, st.buffer},
        [&](ncclComm_t c, cudaStream_t s) {
          copy_async(st.mine, in.data_ptr(), in.nbytes(), s);
          nccl_check(ncclAllGather(st.mine, st.base, st.plan.part * es, ncclUint8, c, s),
                     "ncclAllGather");
        },
        [&](cudaStream_t s) { run_copies(st.plan.unpack, st.base, out.data_ptr(), es, s); });
  }

  // Uneven counts: the input packed into a staging buffer of max(counts) per rank, one
  // ncclReduceScatter in place, this rank's part copied out.
  void reduce_scatter(const Tensor& in, Tensor& out, std::span<const int64_t> counts, ReduceOp op,
                      const OpContext& ctx) override {
    const size_t es = in.element_size();
    const auto type = nccl_type(in.dtype());
    const auto red = nccl_op(in.dtype(), op);
    if (internal::counts_even(counts)) {
      run(ctx, "reduce_scatter", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
        nccl_check(ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(counts[0]),
                                     type, red, c, s),
                   "ncclReduceScatter");
      });
      return;
    }
    const Staging st = staging_for(counts, in.dtype());
    run(
        ctx, "reduce_scatter", {in, out, st.buffer},
        [&](ncclComm_t c, cudaStream_t s) {
          run_copies(st.plan.pack, in.data_ptr(), st.base, es, s);
          nccl_check(ncclReduceScatter(st.base, st.mine, static_cast<size_t>(st.plan.part), type,
                                       red, c, s),
                     "ncclReduceScatter");
        },
        [&](cudaStream_t s) { copy_async(out.data_ptr(), st.mine, out.nbytes(), s); });
  }

  void all_to_all(const Tensor& in, Tensor& out, std::span<const int64_t> send_counts,
                  std::span<const int64_t> recv_counts, const OpContext& ctx) override {
    const size_t es = in.element_size();
    run(ctx, "all_to_all", {in, out}, [&](ncclComm_t c, cudaStream_t s) {
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      const auto* src = static_cast<const uint8_t*>(in.data_ptr());
      auto* dst = static_cast<uint8_t*>(out.data_ptr());
      for (int r = 0; r < size_; ++r) {
        nccl_check(ncclSend(src, send_counts[r] * es, ncclUint8, r, c, s), "ncclSend");
        nccl_check(ncclRecv(dst, recv_counts[r] * es, ncclUint8, r, c, s), "ncclRecv");
        src += send_counts[r] * es;
        dst += recv_counts[r] * es;
      }
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }

  // NCCL has no tags: messages to one peer match in issue order.
  void send(const Tensor& t, int peer, int, const OpContext& ctx) override {
    run(ctx, "send", {t}, [&](ncclComm_t c, cudaStream_t s) {
      nccl_check(ncclSend(t.data_ptr(), t.nbytes(), ncclUint8, peer, c, s), "ncclSend");
    });
  }
  void recv(Tensor& t, int peer, int, const OpContext& ctx) override {
    run(ctx, "recv", {t}, [&](ncclComm_t c, cudaStream_t s) {
      nccl_check(ncclRecv(t.data_ptr(), t.nbytes(), ncclUint8, peer, c, s), "ncclRecv");
    });
  }

  // Every rank waits for all: the host waits for a one-element all-reduce.
  void barrier(const OpContext& ctx) override {
    run(
        ctx, "barrier", {},
        [&](ncclComm_t c, cudaStream_t s) {
          nccl_check(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, c, s),
                     "ncclAllReduce");
        },
        /*host_waits=*/true);
  }

  std::unique_ptr<CommBackend> split(const SplitRequest& request) override {
    ncclConfig_t config = nonblocking_config();
    // Sharing the parent's resources (NCCL >= 2.18) saves memory per mesh dimension, but the
    // groups then contend for the same channels: opt-in, since mesh dimensions run concurrently.
    config.splitShare = env_bool(EnvKnob::kNcclSplitShare) ? 1 : 0;
    ncclComm_t sub = nullptr;
    CudaDeviceGuard guard(device_);
    comm_->use("ncclCommSplit", [&](ncclComm_t c) {
      nccl_check(ncclCommSplit(c, request.color == kNoColor ? NCCL_SPLIT_NOCOLOR : request.color,
                               request.key, &sub, &config),
                 "ncclCommSplit");
    });
    const Deadline deadline = Deadline::after(request.options.timeout);
    wait_ready(*comm_, deadline, request.options.timeout, "ncclCommSplit");
    if (sub == nullptr) return nullptr;
    auto comm = std::make_shared<NcclComm>(sub, device_);
    wait_ready(*comm, deadline, request.options.timeout, "ncclCommSplit");
    // ncclCommSplit matches the ranks' calls by order alone: ranks that made different groups
    // at this point (lazy mesh dimensions asked for in different orders) get a communicator
    // other than the one they described.
    int count = 0, user_rank = 0;
    comm->use("ncclCommCount", [&](ncclComm_t c) {
      nccl_check(ncclCommCount(c, &count), "ncclCommCount");
      nccl_check(ncclCommUserRank(c, &user_rank), "ncclCommUserRank");
    });
    if (count != static_cast<int>(request.members.size()) || user_rank != request.new_rank) {
      comm->abort();
      throw InvalidArgument(fmt::format(
          "split #{} ('{}'): NCCL made a group of {} ranks with this rank at {}, but this rank "
          "described {} ranks with itself at {}; the ranks split in different orders (make a "
          "mesh's groups eagerly, or ask for lazy ones in the same order on every rank)",
          request.split_index, request.options.name, count, user_rank, request.members.size(),
          request.new_rank));
    }
    return std::make_unique<NcclBackend>(std::move(comm), device_, request.new_rank,
                                         static_cast<int>(request.members.size()),
                                         request.options.timeout);
  }

  void abort(const std::string&) override { comm_->abort(); }

  void abort_together(std::span<CommBackend* const> backends, const std::string&) override {
    std::vector<NcclComm*> comms;
    for (CommBackend* b : backends) {
      if (auto* nccl = dynamic_cast<NcclBackend*>(b)) comms.push_back(nccl->comm_.get());
    }
    NcclComm::abort_together(comms);
  }

 private:
  // The stream a call orders after: the caller's (OpContext::stream), else this thread's current
  // one on the group's device.
  cudaStream_t caller_stream(const OpContext& ctx) const {
    return ctx.stream ? native(*ctx.stream) : current_cuda_stream(device_);
  }

  // Runs one NCCL call on the group's stream:
  //   1. the group's stream waits for the work the caller had queued on its stream when it
  //      issued the call (an event recorded then, on the caller's thread);
  //   2. the call, between its start and end events; a non-blocking communicator may return
  //      before the call is on the stream, so `after` (copies out of a staging buffer) and the
  //      end event are queued once it is;
  //   3. the device part goes back through OpContext::device_work, and the Work completes with
  //      the end event; without a sink (or for `host_waits` calls) the host polls it here.
  // No host thread waits for the device in steps 1-2, and nothing synchronises the device.
  template <typename F>
  void run(const OpContext& ctx, std::string_view what, std::vector<Tensor> tensors, F&& enqueue,
           bool host_waits = false) {
    run(
        ctx, what, std::move(tensors), std::forward<F>(enqueue), [](cudaStream_t) {}, host_waits);
  }
  template <typename F, typename G>
  void run(const OpContext& ctx, std::string_view what, std::vector<Tensor> tensors, F&& enqueue,
           G&& after, bool host_waits = false) {
    CudaDeviceGuard guard(device_);
    const Deadline deadline = Deadline::after(ctx.timeout);
    // Step 1: the event ProcessGroup recorded on the caller's stream at issue; a call made
    // without one (a backend used directly) records one now.
    if (ctx.issued_on_stream) {
      stream_handle_.wait(*ctx.issued_on_stream);
    } else {
      cuda_check(cudaEventRecord(ready_.get(), caller_stream(ctx)), "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(stream_.get(), ready_.get(), 0), "cudaStreamWaitEvent");
    }
    // Step 2. The caching allocator must not hand the tensors' memory to another stream before
    // this stream is past the call, even if their last reference goes first.
    for (const Tensor& t : tensors) t.storage().record_stream(stream_handle_);
    auto work = std::make_unique<NcclDeviceWork>(comm_, device_, std::move(tensors));
    cuda_check(cudaEventRecord(work->start(), stream_.get()), "cudaEventRecord");
    comm_->use(what, [&](ncclComm_t c) { enqueue(c, stream_.get()); });
    wait_ready(*comm_, deadline, ctx.timeout, what);
    after(stream_.get());  // only now is the call on the stream (non-blocking communicator)
    cuda_check(cudaEventRecord(work->end(), stream_.get()), "cudaEventRecord");
    // Step 3.
    if (ctx.device_work != nullptr && !host_waits) {
      *ctx.device_work = std::move(work);
      return;
    }
    Backoff backoff = device_backoff();
    while (!work->query()) {
      if (deadline.expired()) {
        comm_->abort();
        throw Timeout(fmt::format("NCCL {} seq {} did not finish within {}; communicator aborted",
                                  what, ctx.seq, format_duration(ctx.timeout)));
      }
      backoff.pause(deadline);
    }
  }

  // A padded exchange's plan and staging buffer (this rank's part at `mine`). The buffer comes
  // from the caching allocator's pool of the group's stream: the copies and the call run there,
  // so the memory's reuse is ordered after them.
  struct Staging {
    internal::PaddedExchange plan;
    Tensor buffer;
    uint8_t* base = nullptr;
    uint8_t* mine = nullptr;
  };
  Staging staging_for(std::span<const int64_t> counts, DType dtype) const {
    Staging st;
    st.plan = internal::plan_padded_exchange(counts);
    {
      StreamGuard on_stream(stream_handle_);
      st.buffer = empty({st.plan.staging_elements()}, dtype, Device::cuda(device_));
    }
    st.base = static_cast<uint8_t*>(st.buffer.data_ptr());
    st.mine = st.base + static_cast<size_t>(rank_ * st.plan.part) * dtype_size(dtype);
    return st;
  }
  static void copy_async(void* dst, const void* src, size_t bytes, cudaStream_t s) {
    if (bytes == 0) return;
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  }
  static void run_copies(std::span<const internal::ElementCopy> copies, const void* from, void* to,
                         size_t es, cudaStream_t s) {
    for (const internal::ElementCopy& c : copies) {
      copy_async(static_cast<uint8_t*>(to) + static_cast<size_t>(c.to) * es,
                 static_cast<const uint8_t*>(from) + static_cast<size_t>(c.from) * es,
                 static_cast<size_t>(c.count) * es, s);
    }
  }

  std::shared_ptr<NcclComm> comm_;
  const int device_;
  const int rank_;
  const int size_;
  const Nanoseconds timeout_;  // the group's: bounds the drain at destruction
  CudaStream stream_;
  const Stream stream_handle_;  // stream_ as tessel's allocators know it
  CudaEvent ready_;             // the caller's stream at a call's issue; re-recorded per call
  void* scratch_ = nullptr;     // the barrier's one element
};

}  // namespace

bool nccl::is_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::shared_ptr<ProcessGroup> nccl::create_process_group(std::shared_ptr<Store> store, int rank,
                                                         int size, NcclOptions options) {
  TESSEL_CHECK(store != nullptr, InvalidArgument, "nccl::create_process_group: store is null");
  TESSEL_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
               "nccl::create_process_group: rank {} is not in a world of size {}", rank, size);
  options.group.timeout = resolve_group_timeout(options.group);
  int devices = 0;
  cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  TESSEL_CHECK(devices > 0, Unavailable, "NCCL needs a CUDA device and none is visible");
  int device = options.device;
  if (device < 0) device = (options.local_rank >= 0 ? options.local_rank : rank) % devices;
  TESSEL_CHECK(device < devices, InvalidArgument, "cuda:{} requested but {} devices are visible",
               device, devices);
  // ncclCommInitRankConfig takes the current device.
  CudaDeviceGuard guard(device);

  // Rank 0 makes the unique id; everyone reads it from the store.
  const std::string key = fmt::format("nccl/{}/id", options.group.id);
  ncclUniqueId id;
  if (rank == 0) {
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } else {
    const std::string bytes = store->get(key, options.group.timeout);
    TESSEL_CHECK(bytes.size() == sizeof(id), CommError,
                 "store key {} holds {} bytes, expected an ncclUniqueId of {}", key, bytes.size(),
                 sizeof(id));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ncclConfig_t config = nonblocking_config();
  ncclComm_t raw = nullptr;
  nccl_check(ncclCommInitRankConfig(&raw, size, id, rank, &config), "ncclCommInitRankConfig");
  auto comm = std::make_shared<NcclComm>(raw, device);
  wait_ready(*comm, Deadline::after(options.group.timeout), options.group.timeout,
             "ncclCommInitRankConfig");
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  log_debug(LogComponent::kCollectives, "nccl group '{}': rank {} of {} on cuda:{}",
            options.group.name, rank, size, device);
  return std::make_shared<ProcessGroup>(
      std::make_unique<NcclBackend>(std::move(comm), device, rank, size, options.group.timeout),
      options.group, std::move(ranks));
}

}  // namespace tessel
