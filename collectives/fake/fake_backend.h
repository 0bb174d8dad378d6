#pragma once
// The fake backend: one rank's view of a world of any size (65,536 ranks is fine) in which no
// data moves. Every call is appended to a FakeLog (op, bytes, peer, modeled time), so mesh and
// parallel plans can be built and costed at scale in one process. Outputs are left untouched.
// Construction is O(1) apart from the group's member list.
//
// Time model. By default every call completes at once. With FakeOptions{latency,
// bytes_per_second} each call takes
//
//     latency + bytes_sent / bytes_per_second
//
// of real time, where bytes_sent is what this rank would put on the wire (FakeCall::bytes_sent;
// the ring share, so a group of one pays only the latency). The call waits on a condition
// variable until its deadline — asleep, never spinning — on the thread that runs it: the
// caller's for a blocking call, the group's worker thread for {.async = true}, so an async
// collective overlaps the caller's compute as a real transport's does, and the time a caller
// spends in Work::wait is the communication it failed to hide. Calls of one group run one
// at a time (a group is one link); groups do not share bandwidth with each other.
//
//   auto log = std::make_shared<fake::FakeLog>();
//   auto pg = fake::create_process_group(0, 8, {.log = log,
//                                               .latency = std::chrono::microseconds(20),
//                                               .bytes_per_second = 10e9});
//   Work w = pg->all_reduce(grad, {.async = true});   // returns at once
//   ... compute ...
//   w.wait();                        // blocks for whatever of the modeled time is left
//   log->total_modeled();            // what all calls cost, hidden or not
//
// A modeled time longer than the call's timeout fails the call with Timeout at the timeout;
// abort() wakes a waiting call at once (CommError).
//
// split() cannot know other ranks' colours; it throws NotImplemented unless the members are
// given (SplitOptions::members, as DeviceMesh does). Build other sub-groups directly with
// fake::create_process_group(rank_in_sub, sub_size, ...). Sub-groups keep the time model.

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/collectives/process_group.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel::fake {

// One call a fake group saw.
struct FakeCall {
  uint64_t group_id = 0;
  fr::OpType op = fr::OpType::kAllReduce;
  uint64_t seq = 0;        // collective seq (0 for send/recv)
  int peer = -1;           // send/recv peer; broadcast root
  int64_t bytes_sent = 0;  // what this rank would put on the wire with a ring/direct algorithm
  Nanoseconds modeled{0};  // the call's modeled duration (0 without a time model)
};

// Thread-safe append-only log, shared by the fake groups that write to it.
class FakeLog {
 public:
  void append(const FakeCall& call);
  std::vector<FakeCall> calls() const;
  int64_t total_bytes_sent() const;
  // Sum of the calls' modeled durations.
  Nanoseconds total_modeled() const;

 private:
  mutable std::mutex mutex_;
  std::vector<FakeCall> calls_;
};

// What a fake group is made with. Zero latency and zero bytes_per_second (the defaults): calls
// complete at once.
struct FakeOptions {
  std::shared_ptr<FakeLog> log = nullptr;  // null: nothing recorded but the flight recorder
  Nanoseconds latency{0};                  // per call
  double bytes_per_second = 0;             // 0: unlimited bandwidth
};

// Rank `rank`'s group in a fake world of `size` ranks. Throws InvalidArgument for a rank outside
// [0, size), a negative latency, or a negative or non-finite bandwidth.
std::shared_ptr<ProcessGroup> create_process_group(int rank, int size, FakeOptions fake,
                                                   ProcessGroupOptions options = {});
// The same without a time model; `log` may be null.
std::shared_ptr<ProcessGroup> create_process_group(int rank, int size,
                                                   std::shared_ptr<FakeLog> log = nullptr,
                                                   ProcessGroupOptions options = {});

}  // namespace tessel::fake
