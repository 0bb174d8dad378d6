#include "tessel/collectives/compute_span.h"

#include <utility>

#include "tessel/collectives/watchdog.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel {
namespace {

// Devices whose streams run asynchronously to the host (a registered runtime): their spans are
// timed with events. CPU streams are always complete, so host time is the work's time.
bool timed_on_device(Device device) {
  return !device.is_cpu() && !device.is_meta() && device_count(device.type) > 0;
}

}  // namespace

ComputeSpan::ComputeSpan(std::string_view text, Device device) noexcept : device_(device) {
  fr::FlightRecorder& recorder = fr::FlightRecorder::global();
  if (!recorder.enabled()) return;
  record_id_ = recorder.begin_span(text);
  if (record_id_ == 0 || !timed_on_device(device)) return;
  try {
    begin_.emplace(device, /*enable_timing=*/true);
    begin_->record();
  } catch (...) {
    begin_.reset();  // the span stays, timed on the host
  }
}

ComputeSpan::ComputeSpan(ComputeSpan&& other) noexcept
    : record_id_(std::exchange(other.record_id_, 0)),
      device_(other.device_),
      begin_(std::move(other.begin_)) {
  other.begin_.reset();
}

ComputeSpan& ComputeSpan::operator=(ComputeSpan&& other) noexcept {
  if (this != &other) {
    end();
    record_id_ = std::exchange(other.record_id_, 0);
    device_ = other.device_;
    begin_ = std::move(other.begin_);
    other.begin_.reset();
  }
  return *this;
}

void ComputeSpan::end() noexcept {
  if (record_id_ == 0) return;
  const uint64_t id = std::exchange(record_id_, 0);
  std::optional<Event> begin = std::exchange(begin_, std::nullopt);
  if (begin) {
    try {
      Event end(device_, /*enable_timing=*/true);
      end.record();
      Watchdog::global().watch_span(id, std::move(*begin), std::move(end));
      return;
    } catch (...) {
      // No end event: end it on the host below rather than leave it open.
    }
  }
  fr::FlightRecorder::global().end_span(id);
}

}  // namespace tessel
