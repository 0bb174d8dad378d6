// The NCCL backend on this machine's GPUs (label gpu). Every test skips, printing why, where no
// CUDA device is visible. On cuda:0, a world of one: the collectives on device tensors; the
// stream semantics (a call returns once the caller's stream waits for it, synchronize() blocks
// the host); a hung call timed out and aborted by the watchdog, whose CPU time stays small; the
// flight recorder's times against the events' duration; a mesh abort. With two or more GPUs,
// ranks as threads (one device each): data across devices, send/recv, a peer that never comes.
//
// Device tensors wrap cudaMalloc'd memory (Storage::wrap), so the tests need no CUDA tensor
// backend in the build. Without one, the caller's stream is the legacy default stream, so the
// tests' cudaMemcpy calls (on that stream) are ordered after the collectives the way a kernel
// of the caller's would be. A spinning kernel on that stream (nccl_test_kernels.cu) holds
// collectives back for as long as a test wants.

#include "tessel/collectives/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <thread>

#include "device_test_util.h"
#include "nccl_test_kernels.h"
#include "tessel/base/error.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/store/memory_store.h"

namespace tessel {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::contains;
using testing::eventually;

int visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// Why a test needing `n` GPUs cannot run here, or nothing.
std::optional<std::string> missing_gpus(int n) {
  const int seen = visible_devices();
  if (seen >= n) return std::nullopt;
  return fmt::format("needs {} CUDA device{} and this process sees {}: NCCL tests run on GPUs", n,
                     n == 1 ? "" : "s", seen);
}

void check(cudaError_t rc, std::string_view what) {
  if (rc != cudaSuccess) {
    throw CommError(fmt::format("{}: {} ({})", what, cudaGetErrorString(rc), cudaGetErrorName(rc)));
  }
}

// A contiguous tensor in cudaMalloc'd memory of cuda:`device`, freed with its last reference.
Tensor device_tensor(const Shape& shape, DType dtype, int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* data = nullptr;
  check(cudaMalloc(&data, std::max<size_t>(bytes, 1)), "cudaMalloc");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::wrap(data, bytes, Device::cuda(device), [](void* p) { cudaFree(p); });
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

template <typename T>
Tensor device_from(const std::vector<T>& values, DType dtype, int device) {
  Tensor t = device_tensor({static_cast<int64_t>(values.size())}, dtype, device);
  check(cudaMemcpy(t.data_ptr(), values.data(), t.nbytes(), cudaMemcpyHostToDevice),
        "cudaMemcpy to the device");
  return t;
}

// Copies back on the legacy default stream: after everything the caller's stream waits for.
template <typename T>
std::vector<T> to_host(const Tensor& t) {
  std::vector<T> out(static_cast<size_t>(t.numel()));
  check(cudaMemcpy(out.data(), t.data_ptr(), t.nbytes(), cudaMemcpyDeviceToHost),
        "cudaMemcpy to the host");
  return out;
}

std::vector<float> iota_values(int64_t n, float offset = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = offset + static_cast<float>(i % 97);
  return v;
}

std::shared_ptr<ProcessGroup> world_of_one(const std::string& name, uint64_t id,
                                           Nanoseconds timeout = seconds(60)) {
  auto store = std::make_shared<MemoryStore>(seconds(60));
  return nccl::create_process_group(
      store, 0, 1, {.device = 0, .group = {.name = name, .id = id, .timeout = timeout}});
}

// A kernel spinning on `stream` until released (or until this goes away, which then waits for
// the stream to drain, polling, for up to 30 s).
class Spinner {
 public:
  explicit Spinner(cudaStream_t stream) : stream_(stream) {
    check(cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(int), cudaHostAllocMapped),
          "cudaHostAlloc");
    *host_ = 0;
    int* device = nullptr;
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), host_, 0),
          "cudaHostGetDevicePointer");
    testing::launch_spin_until_set(device, stream);
    check(cudaGetLastError(), "spin_until_set launch");
  }
  ~Spinner() {
    release();
    const Deadline deadline = Deadline::after(seconds(30));
    while (cudaStreamQuery(stream_) == cudaErrorNotReady && !deadline.expired()) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    cudaFreeHost(host_);
  }
  Spinner(const Spinner&) = delete;
  Spinner& operator=(const Spinner&) = delete;
  void release() { __atomic_store_n(host_, 1, __ATOMIC_SEQ_CST); }

 private:
  cudaStream_t stream_;
  int* host_ = nullptr;
};

TEST(NcclWorldOfOneTest, CollectivesOnDeviceTensors) {
  if (auto why = missing_gpus(1)) GTEST_SKIP() << *why;
  auto pg = world_of_one("one", 7101);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{1} << 20}) {
    SCOPED_TRACE(fmt::format("{} elements", n));
    const std::vector<float> values = iota_values(n, 3);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      Tensor t = device_from(values, DType::kF32, 0);
      pg->all_reduce(t, {.op = op});
      EXPECT_EQ(to_host<float>(t), values);
    }
    std::vector<int64_t> longs(values.begin(), values.end());
    Tensor l = device_from(longs, DType::kI64, 0);
    pg->all_reduce(l);
    EXPECT_EQ(to_host<int64_t>(l), longs);

    Tensor b = device_from(values, DType::kF32, 0);
    pg->broadcast(b, {.root = 0});
    EXPECT_EQ(to_host<float>(b), values);

    Tensor in = device_from(values, DType::kF32, 0);
    Tensor gathered = device_from(std::vector<float>(values.size(), -1), DType::kF32, 0);
    pg->all_gather(in, gathered);
    EXPECT_EQ(to_host<float>(gathered), values);

    Tensor scattered = device_from(std::vector<float>(values.size(), -1), DType::kF32, 0);
    pg->reduce_scatter(in, scattered);
    EXPECT_EQ(to_host<float>(scattered), values);

    Tensor exchanged = device_from(std::vector<float>(values.size(), -1), DType::kF32, 0);
    pg->all_to_all(in, exchanged);
    EXPECT_EQ(to_host<float>(exchanged), values);
  }
  pg->barrier();
  // A rank cannot send to itself (ProcessGroup refuses peer == rank): send/recv need two GPUs.
  Tensor t = device_tensor({4}, DType::kF32, 0);
  EXPECT_THROW(pg->send(t, 0), InvalidArgument);
  Tensor host = zeros({4});
  EXPECT_THROW(pg->all_reduce(host), InvalidArgument);
}

TEST(NcclStreamTest, CallReturnsBeforeTheCallersKernelEnds_SynchronizeWaitsForIt) {
  if (auto why = missing_gpus(1)) GTEST_SKIP() << *why;
  auto pg = world_of_one("streams", 7102);
  const std::vector<float> values = iota_values(4096, 1);
  Tensor in = device_from(values, DType::kF32, 0);
  Tensor out = device_from(std::vector<float>(values.size(), -1), DType::kF32, 0);
  pg->all_gather(in, out).synchronize(seconds(60));  // warm-up: NCCL's first-call set-up

  float* staged = nullptr;  // page-locked, for a copy queued on the caller's stream
  check(cudaMallocHost(reinterpret_cast<void**>(&staged), out.nbytes()), "cudaMallocHost");
  std::fill(staged, staged + values.size(), -2.0f);
  check(cudaMemcpy(out.data_ptr(), staged, out.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
  {
    Spinner spinner(cudaStreamLegacy);  // the caller's "long kernel"
    Stopwatch clock;
    Work w = pg->all_gather(in, out);  // a blocking call: returns once the stream waits for it
    EXPECT_LT(clock.elapsed(), seconds(5));
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_FALSE(w.is_completed()) << "the collective ran before the caller's kernel ended";
    // Queued behind the collective by the wait the call made the caller's stream do.
    check(cudaMemcpyAsync(staged, out.data_ptr(), out.nbytes(), cudaMemcpyDeviceToHost,
                          cudaStreamLegacy),
          "cudaMemcpyAsync");
    // The caller's kernel ends a while later (how long does not matter): synchronize returns
    // only after it has.
    std::atomic<bool> released{false};
    std::thread releaser([&] {
      std::this_thread::sleep_for(milliseconds(200));
      released = true;
      spinner.release();
    });
    EXPECT_TRUE(w.synchronize(seconds(60)));
    EXPECT_TRUE(released) << "synchronize returned while the caller's kernel still ran";
    releaser.join();
    EXPECT_TRUE(w.is_completed());

    // The flight recorder: completed when seen, started the events' duration before it.
    const uint64_t id = w.state()->record_id();
    fr::Entry e;
    ASSERT_TRUE(eventually([&] {
      return fr::FlightRecorder::global().read_entry(id, e) &&
             e.state == fr::EntryState::kCompleted;
    }));
    const Nanoseconds device_time = w.state()->device_time();
    EXPECT_GT(device_time, Nanoseconds::zero());
    EXPECT_NEAR(static_cast<double>(e.completed_ns - e.started_ns),
                static_cast<double>(device_time.count()), 2'000);
    EXPECT_GE(e.started_ns, e.enqueued_ns);
    EXPECT_LE(device_time.count(), e.completed_ns - e.enqueued_ns);
  }  // the spinner's stream drained
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
  EXPECT_EQ(std::vector<float>(staged, staged + values.size()), values)
      << "the copy queued after the call read the output before the collective wrote it";
  cudaFreeHost(staged);
}

TEST(NcclWatchdogTest, HungCallIsTimedOutAndAborted_WatchdogCpuStaysSmall) {
  if (auto why = missing_gpus(1)) GTEST_SKIP() << *why;
  auto pg = world_of_one("hang", 7103, seconds(1));
  Tensor t = device_from(iota_values(1024), DType::kF32, 0);
  pg->all_reduce(t).synchronize(seconds(60));  // warm-up
  {
    Spinner spinner(cudaStreamLegacy);  // never released before the timeout: the call hangs
    Work w = pg->all_reduce(t);
    const testing::HangOutcome hang = testing::synchronize_hung(w);
    EXPECT_TRUE(contains(hang.error, "all_reduce #2 on group 'hang'"));
    EXPECT_TRUE(contains(hang.error, "did not complete within its timeout of 1s (watchdog)"));
    EXPECT_GE(hang.hung, milliseconds(900));
    EXPECT_TRUE(testing::watchdog_stayed_idle(hang));
    EXPECT_TRUE(pg->aborted());  // ncclCommAbort, whatever the policy
    fr::Entry e;
    ASSERT_TRUE(fr::FlightRecorder::global().read_entry(w.state()->record_id(), e));
    EXPECT_EQ(e.state, fr::EntryState::kFailed);
  }
  EXPECT_THROW(pg->all_reduce(t), CommError);
}

TEST(NcclMeshTest, MeshAbortTakesEveryGroupsCommunicatorDown) {
  if (auto why = missing_gpus(1)) GTEST_SKIP() << *why;
  auto world = world_of_one("world", 7104);
  DeviceMesh mesh = init_device_mesh(world, {1, 1}, {"dp", "tp"}, {.eager = true});
  auto dp = mesh.group("dp");
  auto tp = mesh.group("tp");
  Tensor t = device_from(iota_values(256), DType::kF32, 0);
  tp->all_reduce(t).synchronize(seconds(60));
  Work in_flight;
  {
    Spinner spinner(cudaStreamLegacy);
    in_flight = tp->all_reduce(t);  // held back by the spinning kernel
    // The abort may wait for the device to let go of the aborted calls: release it meanwhile.
    std::thread releaser([&] {
      std::this_thread::sleep_for(milliseconds(300));
      spinner.release();
    });
    mesh.abort("stopping the job");
    releaser.join();
  }
  for (const auto& g : {world, dp, tp}) EXPECT_TRUE(g->aborted()) << g->name();
  EXPECT_THROW(in_flight.synchronize(seconds(60)), CommError);
  EXPECT_THROW(dp->all_reduce(t), CommError);
  EXPECT_THROW(world->barrier(), CommError);
}

// One rank per device, as threads. `fn(rank, size)` runs on each; the first failure is rethrown.
template <typename F>
void run_ranks(int size, F&& fn) {
  std::vector<std::thread> ranks;
  std::exception_ptr failure;
  std::mutex mutex;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      try {
        fn(r, size);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (auto& t : ranks) t.join();
  if (failure) std::rethrow_exception(failure);
}

TEST(NcclMultiDeviceTest, AllReduceSumsAcrossDevices) {
  if (auto why = missing_gpus(1)) GTEST_SKIP() << *why;
  const int size = visible_devices();
  auto store = std::make_shared<MemoryStore>(seconds(60));
  const int64_t n = 1001;
  run_ranks(size, [&](int r, int) {
    auto pg = nccl::create_process_group(store, r, size, {.device = r, .group = {.id = 7201}});
    std::vector<float> host(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<float>(r + i % 5);
    Tensor t = device_from(host, DType::kF32, r);
    pg->all_reduce(t);
    const std::vector<float> result = to_host<float>(t);
    const float rank_sum = static_cast<float>(size * (size - 1) / 2);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(result[static_cast<size_t>(i)], rank_sum + static_cast<float>(size * (i % 5)))
          << "rank " << r << " element " << i;
    }
  });
}

TEST(NcclMultiDeviceTest, SendRecvRingAcrossDevices) {
  if (auto why = missing_gpus(2)) GTEST_SKIP() << *why;
  const int size = visible_devices();
  auto store = std::make_shared<MemoryStore>(seconds(60));
  run_ranks(size, [&](int r, int) {
    auto pg = nccl::create_process_group(store, r, size, {.device = r, .group = {.id = 7202}});
    Tensor mine = device_from(iota_values(513, static_cast<float>(r)), DType::kF32, r);
    Tensor theirs = device_from(std::vector<float>(513, -1), DType::kF32, r);
    const int next = (r + 1) % size, prev = (r + size - 1) % size;
    // Blocking pairs: even ranks send first, odd ranks receive first.
    if (r % 2 == 0) {
      pg->send(mine, next);
      pg->recv(theirs, prev);
    } else {
      pg->recv(theirs, prev);
      pg->send(mine, next);
    }
    EXPECT_EQ(to_host<float>(theirs), iota_values(513, static_cast<float>(prev)));
  });
}

// Uneven counts (FSDP's flat buffers) go through one padded ncclAllGather / ncclReduceScatter
// and a staging buffer: the layout is that of the even path, rank parts in rank order.
TEST(NcclMultiDeviceTest, UnevenAllGatherAndReduceScatterAcrossDevices) {
  if (auto why = missing_gpus(2)) GTEST_SKIP() << *why;
  const int size = visible_devices();
  auto store = std::make_shared<MemoryStore>(seconds(60));
  std::vector<int64_t> counts;
  for (int r = 0; r < size; ++r) counts.push_back(r == size - 1 ? 2 : (r == 1 ? 0 : 5 + r));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  run_ranks(size, [&](int r, int) {
    auto pg = nccl::create_process_group(store, r, size, {.device = r, .group = {.id = 7203}});
    std::vector<float> expected;
    for (int q = 0; q < size; ++q) {
      const std::vector<float> part = iota_values(counts[q], 100.0f * q);
      expected.insert(expected.end(), part.begin(), part.end());
    }
    Tensor in = device_from(iota_values(counts[r], 100.0f * r), DType::kF32, r);
    Tensor gathered = device_from(std::vector<float>(total, -1), DType::kF32, r);
    pg->all_gather(in, gathered, {.counts = counts});
    EXPECT_EQ(to_host<float>(gathered), expected) << "rank " << r;

    // Every rank reduces the same `expected`: rank r gets its slice times size.
    Tensor full = device_from(expected, DType::kF32, r);
    Tensor mine = device_from(std::vector<float>(counts[r], -1), DType::kF32, r);
    pg->reduce_scatter(full, mine, {.counts = counts});
    int64_t at = 0;
    for (int q = 0; q < r; ++q) at += counts[q];
    std::vector<float> slice(expected.begin() + at, expected.begin() + at + counts[r]);
    for (float& v : slice) v *= static_cast<float>(size);
    EXPECT_EQ(to_host<float>(mine), slice) << "rank " << r;
  });
}

TEST(NcclMultiDeviceTest, PeerThatNeverComesIsTimedOutAndAborted) {
  if (auto why = missing_gpus(2)) GTEST_SKIP() << *why;
  auto store = std::make_shared<MemoryStore>(seconds(60));
  std::atomic<bool> done{false};
  run_ranks(2, [&](int r, int) {
    auto pg = nccl::create_process_group(
        store, r, 2, {.device = r, .group = {.name = "pair", .id = 7203, .timeout = seconds(1)}});
    Tensor t = device_from(iota_values(1024), DType::kF32, r);
    pg->all_reduce(t).synchronize(seconds(60));  // both ranks once: connections made
    if (r == 1) {  // rank 1 never joins the second all_reduce; it waits for rank 0's verdict
      eventually([&] { return done.load(); }, seconds(60));
      pg->abort("the test is over");
      return;
    }
    struct Done {  // however rank 0 leaves, rank 1 stops waiting
      std::atomic<bool>& flag;
      ~Done() { flag = true; }
    } done_at_exit{done};
    Work w = pg->all_reduce(t);
    const testing::HangOutcome hang = testing::synchronize_hung(w);
    EXPECT_TRUE(contains(hang.error, "all_reduce #2 on group 'pair'"));
    EXPECT_TRUE(testing::watchdog_stayed_idle(hang));
    EXPECT_TRUE(pg->aborted());
    // The aborted kernel lets go of the device: the end event completes and the call is retired.
    EXPECT_TRUE(eventually([&] { return !w.state()->device_pending(); }, seconds(30)));
  });
}

}  // namespace
}  // namespace tessel
