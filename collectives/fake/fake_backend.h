#pragma once
// The fake backend: one rank's view of a world of any size (65,536 ranks is fine) in which no
// data moves. Every call completes at once and is appended to a FakeLog (op, bytes, peer), so
// mesh and parallel plans can be built and costed at scale in one process. Outputs are left
// untouched. Construction is O(1) apart from the group's member list.
//
// split() cannot know other ranks' colours; it throws NotImplemented. Build sub-groups directly
// with fake::create_process_group(rank_in_sub, sub_size, ...).

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

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
};

// Thread-safe append-only log, shared by the fake groups that write to it.
class FakeLog {
 public:
  void append(const FakeCall& call);
  std::vector<FakeCall> calls() const;
  int64_t total_bytes_sent() const;

 private:
  mutable std::mutex mutex_;
  std::vector<FakeCall> calls_;
};

// Rank `rank`'s group in a fake world of `size` ranks. `log` may be null (nothing recorded but
// the flight recorder). Throws InvalidArgument for a rank outside [0, size).
std::shared_ptr<ProcessGroup> create_process_group(int rank, int size,
                                                   std::shared_ptr<FakeLog> log = nullptr,
                                                   ProcessGroupOptions options = {});

}  // namespace tessel::fake
