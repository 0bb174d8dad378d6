#include "tessel/tensor/cuda/cuda_runtime.h"

#include <array>
#include <atomic>

#include "tessel/base/error.h"

namespace tessel::cuda {
namespace {

constexpr int kPoolSize = 32;        // streams per device and priority class
constexpr int kPriorityClasses = 2;  // normal, high

// Owns one CUDA stream.
class StreamHandle {
 public:
  StreamHandle(int device, int priority) : device_(device) {
    check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority),
               "cudaStreamCreateWithPriority", device);
  }
  ~StreamHandle() {
    DeviceGuard guard(device_);
    cudaStreamDestroy(stream_);
  }
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

// Owns a device's error record: page-locked host memory mapped into the device.
class ErrorRecordMemory {
 public:
  explicit ErrorRecordMemory(int device) {
    void* host = nullptr;
    check_cuda(cudaHostAlloc(&host, sizeof(DeviceErrorRecord),
                             cudaHostAllocMapped | cudaHostAllocPortable),
               "cudaHostAlloc (device error record)", device);
    host_ = static_cast<DeviceErrorRecord*>(host);
    *host_ = {};
    void* dev = nullptr;
    check_cuda(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer", device);
    device_ = static_cast<DeviceErrorRecord*>(dev);
  }
  ~ErrorRecordMemory() { cudaFreeHost(host_); }
  ErrorRecordMemory(const ErrorRecordMemory&) = delete;
  ErrorRecordMemory& operator=(const ErrorRecordMemory&) = delete;
  volatile DeviceErrorRecord* host() const { return host_; }
  DeviceErrorRecord* device() const { return device_; }

 private:
  DeviceErrorRecord* host_ = nullptr;
  DeviceErrorRecord* device_ = nullptr;
};

const char* check_name(int check) {
  switch (static_cast<DeviceCheck>(check)) {
    case DeviceCheck::kEmbedding:
      return "embedding";
    case DeviceCheck::kEmbeddingBackward:
      return "embedding backward";
    case DeviceCheck::kCrossEntropy:
      return "cross_entropy target";
    case DeviceCheck::kCrossEntropyBackward:
      return "cross_entropy backward target";
  }
  return "a kernel";
}

}  // namespace

struct CudaRuntime::DeviceState {
  int index = 0;
  int sm_count = 0;
  std::string name;
  int priorities[kPriorityClasses] = {0, 0};  // CUDA priority of each class
  std::mutex mu;                              // guards the pools' creation
  std::vector<std::unique_ptr<StreamHandle>> pools[kPriorityClasses];
  std::atomic<uint32_t> next[kPriorityClasses] = {0, 0};
  std::unique_ptr<ErrorRecordMemory> errors;  // guarded by mu (created once)
  std::atomic<ErrorRecordMemory*> errors_ready{nullptr};
};

namespace {
EventPool::Hooks cuda_event_hooks() {
  return {.create =
              [](int index, bool timing) {
                DeviceGuard guard(index);
                cudaEvent_t event = nullptr;
                check_cuda(cudaEventCreateWithFlags(
                               &event, timing ? cudaEventDefault : cudaEventDisableTiming),
                           "cudaEventCreateWithFlags", index);
                return static_cast<void*>(event);
              },
          .destroy = [](void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }};
}
}  // namespace

CudaRuntime::CudaRuntime() : events_(cuda_event_hooks()) {}
CudaRuntime::~CudaRuntime() = default;

int CudaRuntime::device_count() const {
  std::call_once(count_once_, [this] {
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      cudaGetLastError();
      unavailable_reason_ =
          fmt::format("{}: {}", cudaGetErrorName(status), cudaGetErrorString(status));
      n = 0;
    } else if (n == 0) {
      unavailable_reason_ = "the driver reports no CUDA device";
    }
    count_ = n;
  });
  return count_;
}

std::string CudaRuntime::unavailable_reason() const {
  device_count();
  return unavailable_reason_;
}

CudaRuntime::DeviceState& CudaRuntime::state(int index) {
  TESSEL_CHECK(index >= 0 && index < device_count(), Unavailable,
               "device cuda:{} is not available: this process sees {} CUDA devices", index,
               device_count());
  std::lock_guard<std::mutex> lock(mu_);
  if (devices_.size() < static_cast<size_t>(device_count())) devices_.resize(device_count());
  if (!devices_[index]) {
    auto s = std::make_unique<DeviceState>();
    s->index = index;
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties", index);
    s->sm_count = prop.multiProcessorCount;
    s->name = prop.name;
    int least = 0, greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest),
               "cudaDeviceGetStreamPriorityRange", index);
    s->priorities[0] = least;
    s->priorities[1] = greatest;
    devices_[index] = std::move(s);
  }
  return *devices_[index];
}

int CudaRuntime::sm_count(int index) { return state(index).sm_count; }
std::string CudaRuntime::device_name(int index) { return state(index).name; }

Stream CudaRuntime::default_stream(int index) {
  return Stream(Device::cuda(index), 0, nullptr);  // the legacy default stream
}

Stream CudaRuntime::create_stream(int index, int priority) {
  DeviceState& s = state(index);
  const int cls = priority < 0 ? 1 : 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.pools[cls].empty()) {
      DeviceGuard guard(index);
      for (int i = 0; i < kPoolSize; ++i) {
        s.pools[cls].push_back(std::make_unique<StreamHandle>(index, s.priorities[cls]));
      }
    }
  }
  const uint32_t k = s.next[cls].fetch_add(1, std::memory_order_relaxed) % kPoolSize;
  return Stream(Device::cuda(index), 1 + cls * kPoolSize + static_cast<int64_t>(k),
                s.pools[cls][k]->get());
}

namespace {
cudaStream_t native(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}
}  // namespace

bool CudaRuntime::query_stream(const Stream& stream) {
  const int d = stream.device().index;
  DeviceGuard guard(d);
  const cudaError_t status = cudaStreamQuery(native(stream));
  if (status == cudaErrorNotReady) return false;
  check_cuda(status, "cudaStreamQuery", d);
  raise_device_errors(d);
  return true;
}

void CudaRuntime::synchronize_stream(const Stream& stream) {
  const int d = stream.device().index;
  DeviceGuard guard(d);
  check_cuda(cudaStreamSynchronize(native(stream)), "cudaStreamSynchronize", d);
  raise_device_errors(d);
}

// Events are created on a device; the runtime functions taking only the event use the
// current device for error messages.
void* CudaRuntime::create_event(int index, bool timing) {
  state(index);
  return events_.acquire(index, timing);
}

void CudaRuntime::destroy_event(void* event) noexcept { events_.release(event); }

void CudaRuntime::record_event(void* event, const Stream& stream) {
  const int d = stream.device().index;
  DeviceGuard guard(d);
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event), native(stream)), "cudaEventRecord",
             d);
}

void CudaRuntime::stream_wait_event(const Stream& stream, void* event) {
  const int d = stream.device().index;
  DeviceGuard guard(d);
  check_cuda(cudaStreamWaitEvent(native(stream), static_cast<cudaEvent_t>(event), 0),
             "cudaStreamWaitEvent", d);
}

bool CudaRuntime::query_event(void* event) {
  if (!query_event_completion(event)) return false;
  raise_all_device_errors();
  return true;
}

bool CudaRuntime::query_event_completion(void* event) {
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) return false;
  check_cuda(status, "cudaEventQuery", current_device());
  return true;
}

void CudaRuntime::synchronize_event(void* event) {
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize",
             current_device());
  raise_all_device_errors();
}

Nanoseconds CudaRuntime::event_elapsed(void* start, void* end) {
  float ms = 0;
  check_cuda(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
      "cudaEventElapsedTime (both events must be complete)", current_device());
  return Nanoseconds(static_cast<int64_t>(static_cast<double>(ms) * 1e6));
}

void CudaRuntime::synchronize_device(int index) {
  state(index);
  DeviceGuard guard(index);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", index);
  raise_device_errors(index);
}

DeviceErrorRecord* CudaRuntime::error_record(int index) {
  DeviceState& s = state(index);
  if (ErrorRecordMemory* r = s.errors_ready.load(std::memory_order_acquire)) return r->device();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.errors) {
    DeviceGuard guard(index);
    s.errors = std::make_unique<ErrorRecordMemory>(index);
    s.errors_ready.store(s.errors.get(), std::memory_order_release);
  }
  return s.errors->device();
}

void CudaRuntime::raise_device_errors(int index) {
  DeviceState* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index < 0 || static_cast<size_t>(index) >= devices_.size()) return;
    s = devices_[index].get();
  }
  ErrorRecordMemory* r = s == nullptr ? nullptr : s->errors_ready.load(std::memory_order_acquire);
  if (r == nullptr) return;
  volatile DeviceErrorRecord* rec = r->host();
  if (rec->state != 2) return;
  const int check = rec->check;
  const long long value = rec->value, position = rec->position, limit = rec->limit;
  rec->check = 0;
  rec->state = 0;  // the next error may be recorded
  throw OutOfRange(fmt::format(
      "{}: index {} at position {} is out of range [0, {}) (found on cuda:{} by a kernel and "
      "reported at this synchronisation; the results of that kernel are not valid)",
      check_name(check), value, position, limit, index));
}

void CudaRuntime::raise_all_device_errors() {
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = devices_.size();
  }
  for (size_t i = 0; i < n; ++i) raise_device_errors(static_cast<int>(i));
}

CudaRuntime& cuda_runtime() {
  static CudaRuntime* runtime = new CudaRuntime;
  return *runtime;
}

namespace {
Launch make_launch(Device device) {
  CudaRuntime& rt = cuda_runtime();
  Launch l;
  l.device = device.index;
  l.stream = static_cast<cudaStream_t>(current_stream(device).native_handle());
  l.sm_count = rt.sm_count(device.index);
  l.errors = rt.error_record(device.index);
  return l;
}
}  // namespace

DeviceScope::DeviceScope(Device device) : guard(device.index), launch(make_launch(device)) {}

}  // namespace tessel::cuda
