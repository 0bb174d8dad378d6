#include "tessel/tensor/stream.h"

#include <array>
#include <atomic>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/cuda/cuda_builtin.h"
#include "tessel/tensor/internal/builtin_slot.h"

namespace tessel {
namespace {

// The CPU's runtime (also the meta device's): kernels run when issued, so every stream is
// always complete and an event completes when recorded; an event keeps its record time so
// elapsed() measures host time between two records.
class HostRuntime final : public DeviceRuntime {
 public:
  explicit HostRuntime(DeviceType type) : type_(type) {}
  DeviceType device_type() const override { return type_; }
  int device_count() const override { return 1; }
  Stream default_stream(int) override { return Stream(Device{type_, 0}, 0, nullptr); }
  Stream create_stream(int, int) override {
    return Stream(Device{type_, 0}, next_id_.fetch_add(1, std::memory_order_relaxed), nullptr);
  }
  bool query_stream(const Stream&) override { return true; }
  void synchronize_stream(const Stream&) override {}
  void* create_event(int, bool) override { return new int64_t(0); }
  void destroy_event(void* event) noexcept override { delete static_cast<int64_t*>(event); }
  void record_event(void* event, const Stream&) override {
    *static_cast<int64_t*>(event) = monotonic_ns();
  }
  void stream_wait_event(const Stream&, void*) override {}
  bool query_event(void*) override { return true; }
  void synchronize_event(void*) override {}
  Nanoseconds event_elapsed(void* start, void* end) override {
    return Nanoseconds(*static_cast<int64_t*>(end) - *static_cast<int64_t*>(start));
  }
  void synchronize_device(int) override {}

 private:
  DeviceType type_;
  std::atomic<int64_t> next_id_{1};
};

HostRuntime g_cpu_runtime(DeviceType::kCPU);
HostRuntime g_meta_runtime(DeviceType::kMeta);
std::array<std::atomic<DeviceRuntime*>, kDeviceTypeCount> g_runtimes = {&g_cpu_runtime, nullptr,
                                                                        &g_meta_runtime};

// The registered runtime of `type`; CUDA's is taken from the CUDA backend on first use (null
// in a build without it).
DeviceRuntime* runtime_slot(DeviceType type) {
  std::atomic<DeviceRuntime*>& slot = g_runtimes[static_cast<size_t>(type)];
  if (type != DeviceType::kCUDA) return slot.load(std::memory_order_acquire);
  return internal::slot_or_builtin(slot, &cuda::builtin_runtime);
}

// This thread's current streams, for the devices it has set one on (few: a linear list).
thread_local std::vector<Stream> t_current;

}  // namespace

DeviceRuntime& runtime_for(DeviceType type) {
  DeviceRuntime* r = runtime_slot(type);
  TESSEL_CHECK(r != nullptr, Unavailable,
               "no runtime for {} devices: this build of tessel has no backend for them",
               device_type_name(type));
  return *r;
}

void register_device_runtime(DeviceType type, DeviceRuntime* runtime) {
  g_runtimes[static_cast<size_t>(type)].store(runtime, std::memory_order_release);
}

int device_count(DeviceType type) {
  DeviceRuntime* r = runtime_slot(type);
  return r == nullptr ? 0 : r->device_count();
}

void check_device_available(Device device) {
  if (device.is_cpu() || device.is_meta()) return;
  const int count = device_count(device.type);
  TESSEL_CHECK(
      device.index >= 0 && device.index < count, Unavailable,
      "device {} is not available: this process sees {} such device{}{}", device.str(), count,
      count == 1 ? "" : "s",
      runtime_slot(device.type) == nullptr ? " (this build of tessel has no backend for it)" : "");
}

void synchronize(Device device) {
  check_device_available(device);
  runtime_for(device.type).synchronize_device(device.index);
}

// ---- Stream ---------------------------------------------------------------------------------

struct Event::Impl {
  Device device;
  bool timing = false;
  bool recorded = false;
  void* native = nullptr;
  ~Impl() {
    if (native != nullptr) runtime_for(device.type).destroy_event(native);
  }
};

bool Stream::query() const { return runtime_for(device_.type).query_stream(*this); }
void Stream::synchronize() const { runtime_for(device_.type).synchronize_stream(*this); }

void Stream::wait(const Event& event) const {
  TESSEL_CHECK(event.device().type == device_.type, InvalidArgument,
               "{} cannot wait for an event of {}", str(), event.device().str());
  if (!event.recorded()) return;
  runtime_for(device_.type).stream_wait_event(*this, event.impl_->native);
}

std::string Stream::str() const { return fmt::format("{} stream {}", device_.str(), id_); }

Stream default_stream(Device device) {
  check_device_available(device);
  return runtime_for(device.type).default_stream(device.index);
}

Stream create_stream(Device device, int priority) {
  check_device_available(device);
  return runtime_for(device.type).create_stream(device.index, priority);
}

Stream current_stream(Device device) {
  for (const Stream& s : t_current) {
    if (s.device() == device) return s;
  }
  return default_stream(device);
}

void set_current_stream(const Stream& stream) {
  for (Stream& s : t_current) {
    if (s.device() == stream.device()) {
      s = stream;
      return;
    }
  }
  t_current.push_back(stream);
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  set_current_stream(stream);
}
StreamGuard::~StreamGuard() { set_current_stream(previous_); }

// ---- Event ----------------------------------------------------------------------------------

Event::Event(Device device, bool enable_timing) : impl_(std::make_shared<Impl>()) {
  check_device_available(device);
  impl_->device = device;
  impl_->timing = enable_timing;
  impl_->native = runtime_for(device.type).create_event(device.index, enable_timing);
}

Device Event::device() const { return impl_->device; }

void Event::record(const Stream& stream) {
  TESSEL_CHECK(stream.device() == impl_->device, InvalidArgument,
               "an event of {} cannot be recorded on {}", impl_->device.str(), stream.str());
  runtime_for(impl_->device.type).record_event(impl_->native, stream);
  impl_->recorded = true;
}

void Event::record() { record(current_stream(impl_->device)); }

bool Event::recorded() const { return impl_->recorded; }

bool Event::query() const {
  return !impl_->recorded || runtime_for(impl_->device.type).query_event(impl_->native);
}

bool Event::query_completion() const {
  return !impl_->recorded || runtime_for(impl_->device.type).query_event_completion(impl_->native);
}

void Event::synchronize() const {
  if (impl_->recorded) runtime_for(impl_->device.type).synchronize_event(impl_->native);
}

Nanoseconds Event::elapsed(const Event& end) const {
  TESSEL_CHECK(impl_->timing && end.impl_->timing, InvalidArgument,
               "Event::elapsed needs two events created with enable_timing");
  TESSEL_CHECK(impl_->recorded && end.impl_->recorded, InvalidArgument,
               "Event::elapsed needs two recorded events");
  TESSEL_CHECK(impl_->device == end.impl_->device, InvalidArgument,
               "Event::elapsed between events of {} and {}", impl_->device.str(),
               end.impl_->device.str());
  return runtime_for(impl_->device.type).event_elapsed(impl_->native, end.impl_->native);
}

}  // namespace tessel
