#pragma once
// Streams and events: how work is ordered on every device.
//
// A Stream is an ordered queue of work on one device; kernels run on their device's current
// stream (one per device per thread, default: the device's default stream). Work on two streams
// is ordered only by events: record an Event on one stream and make the other wait for it.
// Nothing here synchronises a whole device. On the CPU, kernels run on the calling thread when
// they are issued, so CPU streams are always complete and CPU events complete when recorded;
// the interface is the same, so code written for GPUs runs unchanged on the CPU.
//
//   Stream comm = create_stream(device);        // e.g. for collectives
//   Event ready(device);
//   ready.record();                              // on the current (compute) stream
//   comm.wait(ready);                            // comm's later work starts after it
//   { StreamGuard on_comm(comm); ... }           // kernels here are issued on comm
//
// Thread-safety: Stream is a value (device, id, native handle) and may be copied anywhere;
// the current stream is per thread. Event is a shared handle: copies refer to one event;
// record() and query() may race only as the device API allows (record from one thread).

#include <cstdint>
#include <memory>
#include <string>

#include "tessel/base/clock.h"
#include "tessel/tensor/device.h"

namespace tessel {

class Event;

class Stream {
 public:
  // The CPU's default stream.
  Stream() = default;
  // For device runtimes: a stream of `device` with its runtime's id and native handle
  // (a cudaStream_t on CUDA, null on the CPU).
  Stream(Device device, int64_t id, void* native_handle)
      : device_(device), id_(id), native_(native_handle) {}

  Device device() const { return device_; }
  // 0 for the device's default stream.
  int64_t id() const { return id_; }
  void* native_handle() const { return native_; }

  // True when all work issued to the stream so far has completed. Non-blocking.
  bool query() const;
  // Blocks the calling thread until all work issued so far has completed.
  void synchronize() const;
  // Work issued to this stream after this call starts only after `event`'s recorded work has
  // completed. Non-blocking. An event that was never recorded is complete.
  void wait(const Event& event) const;

  bool operator==(const Stream& other) const {
    return device_ == other.device_ && id_ == other.id_;
  }
  // "cpu stream 0", "cuda:1 stream 3".
  std::string str() const;

 private:
  Device device_;
  int64_t id_ = 0;
  void* native_ = nullptr;
};

// The default stream of `device`.
Stream default_stream(Device device);
// A stream of `device` other than the default one, from the device's pool (streams are never
// destroyed; a pool hands them out round robin). Lower priority numbers run first where the
// device supports priorities (CUDA); 0 is normal.
Stream create_stream(Device device, int priority = 0);
// The stream kernels on `device` are issued to on this thread.
Stream current_stream(Device device);
// Makes `stream` current for its device on this thread.
void set_current_stream(const Stream& stream);

// Makes a stream current for its device for a scope on this thread, then restores the previous.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// A marker in a stream's work. Copies share the event.
class Event {
 public:
  // With timing, elapsed() can measure between two events (costs a little on CUDA).
  explicit Event(Device device = Device::cpu(), bool enable_timing = false);

  Device device() const;
  // Captures the work issued so far to `stream` (default: the device's current stream on this
  // thread); a later record() replaces what an earlier one captured. Non-blocking.
  void record(const Stream& stream);
  void record();
  bool recorded() const;
  // True when the captured work has completed (or nothing was recorded). Non-blocking.
  bool query() const;
  // As query(), for an observer on another thread (the watchdog): errors that kernels recorded
  // on the device are not reported here but left for the issuing thread's next query or
  // synchronisation. Throws only for a failure of the query itself.
  bool query_completion() const;
  // Blocks the calling thread until the captured work has completed.
  void synchronize() const;
  // Device time from this event to `end`: both recorded with timing enabled, on one device,
  // and complete. Throws InvalidArgument otherwise.
  Nanoseconds elapsed(const Event& end) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  friend class Stream;
};

// What a device type implements for streams and events. The CPU's is built in; the CUDA
// backend registers its own at start-up. Implementations are thread-safe.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceType device_type() const = 0;
  // Devices of this type that can be used now (0 when the driver reports none).
  virtual int device_count() const = 0;
  virtual Stream default_stream(int index) = 0;
  virtual Stream create_stream(int index, int priority) = 0;
  virtual bool query_stream(const Stream& stream) = 0;
  virtual void synchronize_stream(const Stream& stream) = 0;
  // Native events are opaque handles owned by Event.
  virtual void* create_event(int index, bool timing) = 0;
  virtual void destroy_event(void* event) noexcept = 0;
  virtual void record_event(void* event, const Stream& stream) = 0;
  virtual void stream_wait_event(const Stream& stream, void* event) = 0;
  virtual bool query_event(void* event) = 0;
  // As query_event, without reporting errors kernels recorded on the device (Event's
  // query_completion). Runtimes whose queries report none need not override it.
  virtual bool query_event_completion(void* event) { return query_event(event); }
  virtual void synchronize_event(void* event) = 0;
  virtual Nanoseconds event_elapsed(void* start, void* end) = 0;
  // Blocks until all work on the device is done. For tests, benchmarks and shutdown only.
  virtual void synchronize_device(int index) = 0;
};

// The runtime for `type`. Throws Unavailable when this build has none for it.
DeviceRuntime& runtime_for(DeviceType type);
// Registers the runtime of `type` (not owned; must outlive its use).
void register_device_runtime(DeviceType type, DeviceRuntime* runtime);
// Devices of `type` usable now: 0 when this build has no runtime for it or none is present.
int device_count(DeviceType type);
// Throws Unavailable naming the device unless it exists (CPU and meta always do).
void check_device_available(Device device);
// runtime_for(device.type).synchronize_device(device.index): for tests and benchmarks.
void synchronize(Device device);

}  // namespace tessel
