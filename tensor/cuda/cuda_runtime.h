#pragma once
// Private: the CUDA DeviceRuntime (streams from per-device pools, cudaEvent-based events,
// synchronisation) and what kernels need from it: the launch context of a device and the
// device-side error records that turn a bad index found by a kernel into an error at the next
// synchronisation.
//
// Events come from a pool (event_pool.h): destroy_event gives one back for the next
// create_event of its device and kind.
//
// Streams: default_stream(i) is CUDA's legacy default stream (what the NCCL backend orders
// against); create_stream() hands out, round robin, one of 32 non-blocking streams per device
// and priority class (normal for priority >= 0, high otherwise), created on first use and
// kept for the life of the process. Nothing here synchronises a device except
// synchronize_device (tests, benchmarks, shutdown).
//
// Blocking waits (stream, event and device synchronisation) have no timeout: CUDA offers none,
// and a hung kernel is the watchdog's business for collectives.

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/tensor/cuda/cuda_check.h"
#include "tessel/tensor/cuda/cuda_kernels.h"
#include "tessel/tensor/cuda/event_pool.h"
#include "tessel/tensor/storage.h"
#include "tessel/tensor/stream.h"

namespace tessel::cuda {

// Thread-safe. One process-wide instance (cuda_runtime()), never destroyed: tensors in static
// objects may free memory during exit.
class CudaRuntime final : public DeviceRuntime {
 public:
  CudaRuntime();
  ~CudaRuntime() override;

  DeviceType device_type() const override { return DeviceType::kCUDA; }
  int device_count() const override;
  Stream default_stream(int index) override;
  Stream create_stream(int index, int priority) override;
  bool query_stream(const Stream& stream) override;
  void synchronize_stream(const Stream& stream) override;
  void* create_event(int index, bool timing) override;
  void destroy_event(void* event) noexcept override;
  void record_event(void* event, const Stream& stream) override;
  void stream_wait_event(const Stream& stream, void* event) override;
  bool query_event(void* event) override;
  bool query_event_completion(void* event) override;
  void synchronize_event(void* event) override;
  Nanoseconds event_elapsed(void* start, void* end) override;
  void synchronize_device(int index) override;

  // The pool behind create_event / destroy_event (and the allocator's events): what it made and
  // reused, for tests.
  EventPool::Counts event_counts() const { return events_.counts(); }

  // Why device_count() is 0 (CUDA's error text), or "" when devices were found.
  std::string unavailable_reason() const;
  // The device's multiprocessor count and name (device must exist).
  int sm_count(int index);
  std::string device_name(int index);
  // The device address of the device's error record (created on first use).
  DeviceErrorRecord* error_record(int index);
  // Throws OutOfRange describing the first bad value a kernel on device `index` reported since
  // the last check, and clears it. Call after a synchronisation (the record is then complete).
  void raise_device_errors(int index);
  // As raise_device_errors, for every device that has a record.
  void raise_all_device_errors();

 private:
  struct DeviceState;
  DeviceState& state(int index);

  mutable std::once_flag count_once_;
  mutable int count_ = 0;
  mutable std::string unavailable_reason_;
  std::mutex mu_;
  std::vector<std::unique_ptr<DeviceState>> devices_;  // guarded by mu_ (created on demand)
  EventPool events_;
};

CudaRuntime& cuda_runtime();

// Device memory for a kernel's temporaries, from the caching allocator for the device's current
// stream; it goes back to that stream's pool when the Scratch goes away, and later work on the
// stream is ordered after the kernel, so the reuse is safe. Holds nothing for 0 bytes.
class Scratch {
 public:
  Scratch(int64_t bytes, Device device)
      : storage_(bytes > 0 ? Storage::allocate(static_cast<size_t>(bytes), device) : Storage()) {}
  void* get() const { return storage_.defined() ? storage_.data() : nullptr; }

 private:
  Storage storage_;
};

// A device made current for a scope, with the launch context of its current stream.
struct DeviceScope {
  explicit DeviceScope(Device device);
  DeviceGuard guard;
  Launch launch;
};

}  // namespace tessel::cuda
