#include "tessel/collectives/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/comm_backend.h"

namespace tessel {
namespace {

void cuda_check(cudaError_t rc, std::string_view call) {
  if (rc == cudaSuccess) return;
  throw CommError(fmt::format("{} failed: {} ({})", call, cudaGetErrorString(rc),
                              cudaGetErrorName(rc)));
}

// ncclInProgress is not an error for non-blocking communicators: completion is polled.
void nccl_check(ncclResult_t rc, std::string_view call) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  if (rc == ncclRemoteError) {
    throw PeerLost(fmt::format("{} failed: a remote rank failed: {}", call,
                               ncclGetErrorString(rc)));
  }
  throw CommError(fmt::format("{} failed: {} (NCCL {})", call, ncclGetErrorString(rc),
                              static_cast<int>(rc)));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI64: return ncclInt64;
    case DType::kI32: return ncclInt32;
    case DType::kBool: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool) {  // or / and
    return op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kMax ? ncclMax
                                                                                 : ncclMin;
  }
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kProduct: return ncclProd;
  }
  return ncclSum;
}

// Owns one non-blocking communicator; aborts it instead of destroying once it failed.
class NcclComm {
 public:
  explicit NcclComm(ncclComm_t comm) : comm_(comm) {}
  ~NcclComm() {
    if (comm_ == nullptr) return;
    if (aborted_) return;
    ncclCommDestroy(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }
  void abort() {
    if (comm_ != nullptr && !aborted_.exchange(true)) ncclCommAbort(comm_);
  }
  bool aborted() const { return aborted_; }

 private:
  ncclComm_t comm_;
  std::atomic<bool> aborted_{false};
};

class CudaStream {
 public:
  explicit CudaStream(int device) {
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaStream() {
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }
  // Makes this stream wait for the work queued so far on the legacy default stream (where the
  // tensor's producers ran), without blocking the host.
  void wait_for_default_stream() {
    cuda_check(cudaEventRecord(ready_, cudaStreamLegacy), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
};

// Polls until the communicator has no operation in progress, aborting it at the deadline.
void wait_ready(NcclComm& comm, const Deadline& deadline, Nanoseconds timeout,
                std::string_view what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm.get(), &state), "ncclCommGetAsyncError");
    if (state == ncclSuccess) return;
    nccl_check(state, what);
    if (deadline.expired()) {
      comm.abort();
      throw Timeout(fmt::format("NCCL {} did not finish within {}; communicator aborted", what,
                                format_duration(timeout)));
    }
    std::this_thread::yield();
  }
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

class NcclBackend final : public CommBackend {
 public:
  NcclBackend(std::unique_ptr<NcclComm> comm, int device, int rank, int size)
      : comm_(std::move(comm)), device_(device), rank_(rank), size_(size), stream_(device) {
    cuda_check(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
  }
  ~NcclBackend() override { cudaFree(scratch_); }

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void check_device(const Tensor& t) const override {
    TESSEL_CHECK(t.device().is_cuda() && t.device().index == device_, InvalidArgument,
                 "the nccl group of rank {} uses cuda:{}, got {}", rank_, device_, t.str());
  }

  void all_reduce(Tensor& t, ReduceOp op, const OpContext& ctx) override {
    run(ctx, "all_reduce", [&](cudaStream_t s) {
      nccl_check(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                               nccl_type(t.dtype()), nccl_op(t.dtype(), op), comm_->get(), s),
                 "ncclAllReduce");
    });
  }

  void broadcast(Tensor& t, int root, const OpContext& ctx) override {
    run(ctx, "broadcast", [&](cudaStream_t s) {
      nccl_check(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root,
                               comm_->get(), s),
                 "ncclBroadcast");
    });
  }

  void all_gather(const Tensor& in, Tensor& out, std::span<const int64_t> counts,
                  const OpContext& ctx) override {
    const bool even = std::all_of(counts.begin(), counts.end(),
                                  [&](int64_t c) { return c == counts[0]; });
    const size_t es = in.element_size();
    run(ctx, "all_gather", [&](cudaStream_t s) {
      if (even) {
        nccl_check(ncclAllGather(in.data_ptr(), out.data_ptr(), counts[0] * es, ncclUint8,
                                 comm_->get(), s),
                   "ncclAllGather");
        return;
      }
      // Uneven: one broadcast per rank into its slice, fused in a group.
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      auto* dst = static_cast<uint8_t*>(out.data_ptr());
      for (int r = 0; r < size_; ++r) {
        const size_t bytes = static_cast<size_t>(counts[r]) * es;
        nccl_check(ncclBroadcast(r == rank_ ? in.data_ptr() : dst, dst, bytes, ncclUint8, r,
                                 comm_->get(), s),
                   "ncclBroadcast");
        dst += bytes;
      }
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }

  void reduce_scatter(const Tensor& in, Tensor& out, std::span<const int64_t> counts, ReduceOp op,
                      const OpContext& ctx) override {
    const bool even = std::all_of(counts.begin(), counts.end(),
                                  [&](int64_t c) { return c == counts[0]; });
    const size_t es = in.element_size();
    const auto type = nccl_type(in.dtype());
    const auto red = nccl_op(in.dtype(), op);
    run(ctx, "reduce_scatter", [&](cudaStream_t s) {
      if (even) {
        nccl_check(ncclReduceScatter(in.data_ptr(), out.data_ptr(),
                                     static_cast<size_t>(counts[0]), type, red, comm_->get(), s),
                   "ncclReduceScatter");
        return;
      }
      // Uneven: one reduce per rank onto its owner, fused in a group.
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      const auto* src = static_cast<const uint8_t*>(in.data_ptr());
      for (int r = 0; r < size_; ++r) {
        nccl_check(ncclReduce(src, out.data_ptr(), static_cast<size_t>(counts[r]), type, red, r,
                              comm_->get(), s),
                   "ncclReduce");
        src += static_cast<size_t>(counts[r]) * es;
      }
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }

  void all_to_all(const Tensor& in, Tensor& out, std::span<const int64_t> send_counts,
                  std::span<const int64_t> recv_counts, const OpContext& ctx) override {
    const size_t es = in.element_size();
    run(ctx, "all_to_all", [&](cudaStream_t s) {
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      const auto* src = static_cast<const uint8_t*>(in.data_ptr());
      auto* dst = static_cast<uint8_t*>(out.data_ptr());
      for (int r = 0; r < size_; ++r) {
        nccl_check(ncclSend(src, send_counts[r] * es, ncclUint8, r, comm_->get(), s), "ncclSend");
        nccl_check(ncclRecv(dst, recv_counts[r] * es, ncclUint8, r, comm_->get(), s), "ncclRecv");
        src += send_counts[r] * es;
        dst += recv_counts[r] * es;
      }
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }

  // NCCL has no tags: messages to one peer match in issue order.
  void send(const Tensor& t, int peer, int, const OpContext& ctx) override {
    run(ctx, "send", [&](cudaStream_t s) {
      nccl_check(ncclSend(t.data_ptr(), t.nbytes(), ncclUint8, peer, comm_->get(), s), "ncclSend");
    });
  }
  void recv(Tensor& t, int peer, int, const OpContext& ctx) override {
    run(ctx, "recv", [&](cudaStream_t s) {
      nccl_check(ncclRecv(t.data_ptr(), t.nbytes(), ncclUint8, peer, comm_->get(), s), "ncclRecv");
    });
  }

  void barrier(const OpContext& ctx) override {
    run(ctx, "barrier", [&](cudaStream_t s) {
      nccl_check(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_->get(), s),
                 "ncclAllReduce");
    });
  }

  std::unique_ptr<CommBackend> split(const SplitRequest& request) override {
    ncclConfig_t config = nonblocking_config();
    // Sharing the parent's resources (NCCL >= 2.18) saves memory per mesh dimension, but the
    // groups then contend for the same channels: opt-in, since mesh dimensions run concurrently.
    config.splitShare = env_bool(EnvKnob::kNcclSplitShare) ? 1 : 0;
    ncclComm_t sub = nullptr;
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    nccl_check(ncclCommSplit(comm_->get(),
                             request.color == kNoColor ? NCCL_SPLIT_NOCOLOR : request.color,
                             request.key, &sub, &config),
               "ncclCommSplit");
    const Deadline deadline = Deadline::after(request.options.timeout);
    wait_ready(*comm_, deadline, request.options.timeout, "ncclCommSplit");
    if (sub == nullptr) return nullptr;
    auto comm = std::make_unique<NcclComm>(sub);
    wait_ready(*comm, deadline, request.options.timeout, "ncclCommSplit");
    return std::make_unique<NcclBackend>(std::move(comm), device_, request.new_rank,
                                         static_cast<int>(request.members.size()));
  }

  void abort(const std::string&) override { comm_->abort(); }

 private:
  // Enqueues on the group's stream after the default stream's work, then polls the stream and
  // the communicator until done; at the deadline the communicator is aborted.
  template <typename F>
  void run(const OpContext& ctx, std::string_view what, F&& enqueue) {
    TESSEL_CHECK(!comm_->aborted(), CommError, "the NCCL communicator was aborted");
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    stream_.wait_for_default_stream();
    const Deadline deadline = Deadline::after(ctx.timeout);
    enqueue(stream_.get());
    wait_ready(*comm_, deadline, ctx.timeout, what);
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream_.get());
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) cuda_check(state, "cudaStreamQuery");
      ncclResult_t async = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(comm_->get(), &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) nccl_check(async, what);
      if (deadline.expired()) {
        comm_->abort();
        throw Timeout(fmt::format("NCCL {} seq {} did not finish within {}; communicator aborted",
                                  what, ctx.seq, format_duration(ctx.timeout)));
      }
      std::this_thread::yield();
    }
  }

  std::unique_ptr<NcclComm> comm_;
  const int device_;
  const int rank_;
  const int size_;
  CudaStream stream_;
  void* scratch_ = nullptr;
};

}  // namespace

bool nccl_is_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::shared_ptr<ProcessGroup> nccl_create_process_group(std::shared_ptr<Store> store, int rank,
                                                        int size, NcclOptions options) {
  TESSEL_CHECK(store != nullptr, InvalidArgument, "nccl_create_process_group: store is null");
  TESSEL_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
               "nccl_create_process_group: rank {} is not in a world of size {}", rank, size);
  options.group.timeout = resolve_group_timeout(options.group);
  int devices = 0;
  cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  TESSEL_CHECK(devices > 0, Unavailable, "NCCL needs a CUDA device and none is visible");
  int device = options.device;
  if (device < 0) {
    const char* local = std::getenv("LOCAL_RANK");
    device = (local != nullptr ? std::atoi(local) : rank) % devices;
  }
  TESSEL_CHECK(device < devices, InvalidArgument, "cuda:{} requested but {} devices are visible",
               device, devices);
  cuda_check(cudaSetDevice(device), "cudaSetDevice");

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
  auto comm = std::make_unique<NcclComm>(raw);
  wait_ready(*comm, Deadline::after(options.group.timeout), options.group.timeout,
             "ncclCommInitRankConfig");
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  log_debug(LogComponent::kCollectives, "nccl group '{}': rank {} of {} on cuda:{}",
            options.group.name, rank, size, device);
  return std::make_shared<ProcessGroup>(
      std::make_unique<NcclBackend>(std::move(comm), device, rank, size), options.group,
      std::move(ranks));
}

}  // namespace tessel
