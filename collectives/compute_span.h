#pragma once
// ComputeSpan: a named span of this process's own work (a module's forward, a group's backward)
// in the flight recorder, beside its collectives, so that an exported trace shows communication
// overlapping compute (tessel-trace export --perfetto puts spans on each rank's "compute" track).
//
//   ComputeSpan span("fsdp forward h.3", device);  // begins now, on the device's current stream
//   ... issue the kernels ...
//   span.end();                                    // or let it go out of scope
//
// Timing. On the CPU (and on a device without a runtime) a span is the host's monotonic interval
// from construction to end(). On a device with a runtime (CUDA) it also records a timed Event on
// the device's current stream at each end, and the watchdog, which polls operations in flight on
// a device, fills in the times once the end event completed, as it does for an NCCL collective:
// completed = when it saw the event, started = that minus the device time between the two events
// (never before the span began on the host). Device-timed spans and collectives are therefore
// both late by up to the watchdog's device poll interval (2 ms); until then the entry reads
// started, like any unfinished span in a dump.
//
// Cost: when the flight recorder is disabled, one relaxed load (no span, no event). Enabled, on
// the CPU: one record and one completion, as a blocking collective; on CUDA two timed events
// more, as an NCCL call has.
//
// Thread-safety: one ComputeSpan is used by one thread at a time; any number of threads may hold
// spans. Move-only; a moved-from or ended span is inactive and end() on it does nothing.

#include <cstdint>
#include <optional>
#include <string_view>

#include "tessel/tensor/device.h"
#include "tessel/tensor/stream.h"

namespace tessel {

class ComputeSpan {
 public:
  // An inactive span.
  ComputeSpan() = default;
  // Begins a span named `text` (the flight recorder keeps 47 bytes) of work issued on `device`'s
  // current stream of this thread from now on. Never throws: a device event that cannot be made
  // leaves the span timed on the host.
  explicit ComputeSpan(std::string_view text, Device device = Device::cpu()) noexcept;
  ~ComputeSpan() { end(); }
  ComputeSpan(ComputeSpan&& other) noexcept;
  // Ends this span (if active), then takes `other`'s.
  ComputeSpan& operator=(ComputeSpan&& other) noexcept;
  ComputeSpan(const ComputeSpan&) = delete;
  ComputeSpan& operator=(const ComputeSpan&) = delete;

  // Ends the span now: on the host at once, on a device with the work issued to the device's
  // current stream of this thread so far. Non-blocking; idempotent.
  void end() noexcept;
  bool active() const { return record_id_ != 0; }
  // The span's flight-recorder record id (0 when inactive).
  uint64_t record_id() const { return record_id_; }

 private:
  uint64_t record_id_ = 0;
  Device device_;
  std::optional<Event> begin_;  // device spans: recorded on the device's stream at the start
};

}  // namespace tessel
