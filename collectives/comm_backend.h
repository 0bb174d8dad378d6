#pragma once
// CommBackend: what a transport implements for ProcessGroup (threads/, gloo/, mpi/, nccl/, fake/).
// ProcessGroup validates arguments, numbers and records every call, and runs it on one thread at
// a time; a backend only moves and reduces the bytes, blocking until done or until the call's
// timeout. Sizes reaching a backend are already checked and every count vector is filled in.
//
// Thread-safety: a backend is driven by one thread at a time (its group's executing thread),
// except missing_ranks(), abort() and abort_together(), which the watchdog may call concurrently.
// Errors: Timeout (naming the ranks that had not arrived, where known), PeerLost when a peer
// went away, CommError for other transport failures; ProcessGroup prefixes group/op/seq.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/collectives/device_work.h"
#include "tessel/collectives/process_group.h"
#include "tessel/tensor/stream.h"
#include "tessel/tensor/tensor.h"

namespace tessel {

// Per-call facts a backend may need.
struct OpContext {
  uint64_t seq = 0;        // the group's collective sequence number (a tag for the transport)
  Nanoseconds timeout{0};  // the call's timeout
  // The caller's current stream on the tensors' device, taken on the caller's thread when the
  // call was issued, where that device type has a registered runtime (tensor/stream.h); empty
  // for CPU tensors and where none is (a CUDA backend then orders after the legacy default
  // stream).
  std::optional<Stream> stream = {};
  // Recorded on `stream` on the caller's thread when the call was issued: the work the call must
  // follow, and no more (an async call may run later on the group's thread, after the caller
  // queued more work on that stream). Set whenever `stream` is.
  std::optional<Event> issued_on_stream = {};
  // Where a backend that enqueues the operation on a device stream instead of finishing it
  // (NCCL) leaves the operation's device part; the Work then completes with it. Null: the
  // backend must finish the operation before returning.
  std::unique_ptr<DeviceWork>* device_work = nullptr;
  // When the caller issued the call (an async call may start later on the group's thread).
  SteadyClock::time_point issued = SteadyClock::now();
};

// A split as every rank of the parent sees it after exchanging (color, key).
struct SplitRequest {
  uint64_t split_index = 0;  // how many splits the parent made before this one (same on all)
  int color = kNoColor;
  int key = 0;
  std::vector<int> members;     // parent ranks of this rank's new group in new-rank order
  int new_rank = -1;            // this rank's place in members (-1 for kNoColor)
  bool members_given = false;   // members came from SplitOptions::members, not an exchange
  ProcessGroupOptions options;  // name, id and timeout of the new group
};

class CommBackend {
 public:
  virtual ~CommBackend() = default;

  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Throws InvalidArgument when the backend cannot use tensors on this device (default: CPU
  // only).
  virtual void check_device(const Tensor& tensor) const;
  // Where small host values (shapes, hashes, flags) go to travel through this backend: the CPU
  // (default), or the GPU of a backend that moves device memory only (NCCL).
  virtual Device default_device() const;

  // kAvg is the sum divided by size() (CPU backends: internal::divide_by after summing).
  virtual void all_reduce(Tensor& tensor, ReduceOp op, const OpContext& ctx) = 0;
  virtual void broadcast(Tensor& tensor, int root, const OpContext& ctx) = 0;
  virtual void all_gather(const Tensor& input, Tensor& output, std::span<const int64_t> counts,
                          const OpContext& ctx) = 0;
  virtual void reduce_scatter(const Tensor& input, Tensor& output, std::span<const int64_t> counts,
                              ReduceOp op, const OpContext& ctx) = 0;
  virtual void all_to_all(const Tensor& input, Tensor& output, std::span<const int64_t> send_counts,
                          std::span<const int64_t> recv_counts, const OpContext& ctx) = 0;
  // The list form (ProcessGroup::all_to_all over views): inputs[j] to rank j, outputs[j] from
  // rank j, size() views each, of one dtype and any strides, elements in row-major order.
  // Default: packs the inputs into one buffer, runs all_to_all and unpacks (on ctx.stream for
  // device tensors, with the host waiting for the transfer so the unpack follows it).
  virtual void all_to_all_views(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                                const OpContext& ctx);
  virtual void send(const Tensor& tensor, int peer, int tag, const OpContext& ctx) = 0;
  virtual void recv(Tensor& tensor, int peer, int tag, const OpContext& ctx) = 0;
  virtual void barrier(const OpContext& ctx) = 0;
  // Called on every parent rank (also those with kNoColor, which get null back).
  virtual std::unique_ptr<CommBackend> split(const SplitRequest& request) = 0;

  // True for a transport whose calls on different groups must reach it in one order on every
  // rank, because it only enqueues them onto device streams where they may wait for each other
  // (NCCL: kernels of several communicators on one GPU, or of split-shared ones). ProcessGroup
  // then runs every collective of such a group at issue, on the calling thread, async ones too,
  // and holds one process-wide lock from taking the sequence number to the end of the enqueue:
  // the order of the collectives reaching the transport is the order of issue, over every such
  // group of the process. send/recv are left to their group's order (a ring of them has no
  // order common to all ranks). Default: false (calls may run on the group's worker thread).
  virtual bool issues_in_process_order() const { return false; }
  // Group ranks known not to have reached collective `seq`; empty when unknown.
  virtual std::vector<int> missing_ranks(uint64_t seq) const;
  // Makes blocked and future calls fail promptly (CommError); best effort.
  virtual void abort(const std::string& reason);
  // Aborts `backends`, all of this backend's kind (name()) and this one among them, at once:
  // NCCL aborts every communicator inside one ncclGroupStart/ncclGroupEnd, so no communicator's
  // teardown waits on another's hung kernel. Default: abort() each in turn.
  virtual void abort_together(std::span<CommBackend* const> backends, const std::string& reason);
};

}  // namespace tessel
