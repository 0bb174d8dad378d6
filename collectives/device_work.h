#pragma once
// DeviceWork: the device side of an operation that a backend enqueued on a device stream instead
// of running it to completion on the host (NCCL). It is the operation's start and end events on
// the group's communication stream, the tensors the operation uses, and how a caller's stream is
// made to wait for it. The backend hands it to ProcessGroup through OpContext::device_work; the
// Work owns it from then on, and the watchdog polls it (no thread ever blocks on the device).
//
// Thread-safety: WorkState serialises the calls (the watchdog polls while a caller waits).
// Ownership: keeps the operation's tensors, its events and whatever query() needs (the
// communicator) alive until it is destroyed: by the Work once the end event completed (or when
// the last handle to a Work still in flight goes away).

#include "tessel/base/clock.h"

namespace tessel {

class DeviceWork {
 public:
  virtual ~DeviceWork() = default;

  // True once the operation's end event completed. Never blocks. Throws PeerLost or CommError
  // when the device or the transport reported an error (e.g. ncclCommGetAsyncError).
  virtual bool query() = 0;
  // Makes the calling thread's current stream of the operation's device wait for the end event.
  // Never blocks the host.
  virtual void wait_on_current_stream() = 0;
  // The device time from the start to the end event; only after query() returned true.
  virtual Nanoseconds elapsed() = 0;
};

}  // namespace tessel
