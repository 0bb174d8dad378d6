#pragma once
// Private: the Gloo backend's pairwise exchange, which carries its all_to_all, all_gather,
// reduce_scatter and all_reduce: every rank sends a view to every other and receives one from
// each, over shared memory with the peers on this host (shm_channel.h) and over Gloo's unbound
// buffers (TCP) with the others. Set-up and the TCP side in pairwise_exchange.cc, the
// shared-memory side in pairwise_exchange_shm.cc.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/collectives/gloo/internal/shm_channel.h"
#include "tessel/tensor/tensor.h"

namespace gloo {
class Context;
}

namespace tessel::internal {

// Which peers an all_to_all may reach through shared memory.
struct SharedMemoryOptions {
  bool enabled = true;  // both ends of a pair must enable it
  // Ranks with equal ids share memory when their segments open (empty: the kernel's boot id).
  std::string host_id = {};
  // Ranks of the job on this host as the launcher says (LOCAL_WORLD_SIZE; 0: not known). With
  // more ranks on the host than CPUs, a waiting rank yields its CPU instead of spinning.
  int local_world_size = 0;
};

// The pairwise exchange (an all_to_all of views) on one Gloo context.
//
// Peers on this host (same boot id, both enabled, each side able to map the other's segment:
// settled once, collectively, in the group's first call) exchange through shared-memory rings:
// a sender copies each view (packing a strided one) straight into the receiver's ring, in chunks,
// while the receiver copies out what has arrived (unpacking into a strided view); each call's
// bytes are preceded by its sequence number and size, which the receiver checks (a mismatch is
// an error on both ends, not a silent misread).
//
// With peers elsewhere, every rank posts all its receives first, so a peer's send
// finds its receive waiting and goes out at once. Each peer's bytes travel in pieces of
// kPieceBytes; in round k a rank sends piece k to rank+1, rank+2, ... (packing a strided view's
// piece just before it goes, while earlier pieces are on the wire) and copies piece k of its own
// chunk straight into its output; a round reads one band of rows of a strided input, which the
// next piece then finds in cache. Then it takes the receives round by round, unpacking a
// strided view's piece as soon as it is in. Piece boundaries depend only on a pair's byte count,
// so its two ends agree whatever their views' shapes. Measured against packing into a ring of a
// few pieces per peer: slower, the sender then waits for the wire instead of packing ahead.
//
// Thread-safety: one call at a time (a backend runs its group's calls one at a time).
// Ownership: keeps the staging memory of strided views between calls (a fresh allocation per
// call page-faults).
class PairwiseExchange {
 public:
  static constexpr size_t kPieceBytes = size_t{256} << 10;

  PairwiseExchange(std::shared_ptr<::gloo::Context> context, SharedMemoryOptions shm);
  ~PairwiseExchange();

  // inputs[j] goes to rank j, outputs[j] receives rank j's inputs[rank]: CPU views of one dtype,
  // any strides, elements in row-major order; inputs[j].numel() must equal rank j's
  // outputs[rank].numel(). `phase` (0-255) tells apart the exchanges of one collective (seq):
  // every rank's must agree. Blocks until all is sent and received. Throws Timeout naming the
  // ranks whose data had not all arrived within `timeout`; PeerLost naming a peer on this host
  // that exited; CommError on both ends when a peer on this host sent another call's data or
  // another byte count than this rank expects (InvalidArgument only for this rank's own block);
  // Gloo's own exceptions otherwise (a lost peer), for the backend to translate.
  void run(std::span<const Tensor> inputs, std::span<const Tensor> outputs, uint64_t seq,
           Nanoseconds timeout, uint32_t phase = 0);

  // The peers reached through shared memory (settled by the first call; empty before).
  std::vector<int> shared_memory_peers() const;
  // Whether some pair of the group's ranks is on one host with shared memory enabled at both
  // ends — the same answer on every rank, so all can choose the same algorithm by it. Settles
  // the pairs first if no call has (collective then: every rank must ask in the same call).
  // Throws as run() does when a peer does not come.
  bool group_may_share_memory(uint64_t seq, Nanoseconds timeout);

 private:
  class LocalCall;  // one call's exchange with the peers on this host

  // One peer on this host: its segment (holding the ring this rank writes), the ring it writes
  // into this rank's segment, and its process.
  struct Local {
    int rank = -1;
    ShmSegment segment;
    ShmRing* out = nullptr;  // in the peer's segment
    ShmRing* in = nullptr;   // in ours
    PeerProcess process;
  };

  uint8_t* staging_for(size_t bytes);
  // Settles which peers share memory: collective, in the group's first call.
  void connect_shared_memory(uint64_t seq, const Deadline& deadline, Nanoseconds timeout);
  // The local peers' bytes and this rank's own chunk (through `bounce`, a piece of scratch, when
  // both of its views are strided). Throws as run(); after a failure every later call throws
  // CommError (the rings are out of step).
  void run_local(std::span<const Tensor> inputs, std::span<const Tensor> outputs, uint64_t call,
                 uint8_t* bounce, const Deadline& deadline, Nanoseconds timeout);

  // Elements [first, first + count) of this rank's own chunk, from its input view straight into
  // its output view (through `bounce`, one piece of scratch, when both are strided).
  static void copy_own(const Tensor& in, const Tensor& out, int64_t first, int64_t count,
                       uint8_t* bounce);

  std::shared_ptr<::gloo::Context> context_;
  SharedMemoryOptions shm_options_;
  bool shm_settled_ = false;
  bool shm_broken_ = false;            // a call over the rings failed: they are out of step
  bool crowded_ = false;               // more ranks on this host than CPUs this one may use
  bool group_has_candidates_ = false;  // some pair of ranks may share memory (any rank's view)
  ShmSegment own_;
  std::vector<int> local_index_;  // per rank: its index in locals_, or -1
  std::vector<Local> locals_;
  std::unique_ptr<uint8_t[]> staging_;
  size_t staging_bytes_ = 0;
};

}  // namespace tessel::internal
