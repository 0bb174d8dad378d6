#pragma once
// ProcessGroup: a set of ranks that run collectives together (all_reduce, broadcast, all_gather,
// reduce_scatter, all_to_all, send/recv, barrier) and split into sub-groups. One class for every
// backend (threads, gloo, mpi, nccl, fake); the backend moves the bytes
// (collectives/comm_backend.h).
//
//   std::shared_ptr<ProcessGroup> world = init_process_group();      // collectives/init.h
//   Tensor grad = ...;                                                // contiguous CPU f32
//   world->all_reduce(grad, {.op = ReduceOp::kAvg});                  // blocks, throws on error
//   Work w = world->all_gather(shard, full, {.async = true});        // returns at once
//   w.wait();                                                         // rethrows its error
//   auto rows = world->split(world->rank() / 4, world->rank());       // groups of 4
//
// Ordering: every rank of a group must issue the group's collectives in the same order, with
// matching sizes and dtypes; each call takes the next per-group sequence number (the flight
// recorder aligns ranks by it). send/recv are matched per (peer, tag) in issue order and carry a
// per-(peer, direction) p2p sequence number. Calls on one group execute one at a time in issue
// order, on the caller's thread when nothing is queued and on the group's worker thread otherwise
// (async calls); different groups run concurrently and the caller orders them consistently. A
// backend that issues_in_process_order() (NCCL) has every collective (not send/recv) enqueued at
// issue on the caller's thread, one at a time over all such groups (collectives/comm_backend.h).
//
// Every call is recorded in the flight recorder before it is issued, marked started when it runs
// and completed or failed when it ends, and registered with the process's watchdog, which fails
// it once it runs past its timeout (collectives/watchdog.h).
//
// On a device with asynchronous streams (NCCL) a call "runs" until it is enqueued: the
// collective is ordered after the work issued so far to the caller's current stream of the
// tensors' device, and the call (also a blocking one) returns once the caller's current stream
// waits for it — the host does not wait for the device (Work::synchronize() does). Such
// operations stay in the group's list of operations in flight until the watchdog (or a caller's
// poll) sees their end events complete; their timeout counts from when they were issued.
//
// Thread-safety: all methods are thread-safe; calls from several threads are ordered by the
// group's internal lock, which is only deterministic across ranks if the caller orders them.
// Ownership: groups are shared (std::shared_ptr) by meshes and users; a group owns its backend
// and its worker thread, and is destroyed after its last queued operation finished (once an
// operation failed in the transport, the ones still queued fail unrun instead of each waiting
// out its timeout against the same lost peer).

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/reduce_op.h"
#include "tessel/collectives/work.h"
#include "tessel/tensor/tensor.h"

namespace tessel {

class CommBackend;
namespace internal {
class GroupWorker;
}

// split(): the color of a rank that joins no new group.
inline constexpr int kNoColor = -1;

// A zero timeout in any options struct means the group's default (ProcessGroupOptions).
struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;  // kAvg divides the sum by size() (integer division for ints)
  Nanoseconds timeout{0};
  bool async = false;  // return at once; the Work finishes on the group's worker thread
};
struct BroadcastOptions {
  int root = 0;  // group rank whose tensor every rank receives
  Nanoseconds timeout{0};
  bool async = false;
};
struct AllGatherOptions {
  // Elements contributed by each rank (size() entries); empty means every rank contributes
  // input.numel() elements. output.numel() must equal the sum.
  std::vector<int64_t> counts = {};
  Nanoseconds timeout{0};
  bool async = false;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  // Elements of the result each rank receives (size() entries); empty means input.numel() /
  // size() each. input.numel() must equal the sum; output.numel() must equal counts[rank()].
  std::vector<int64_t> counts = {};
  Nanoseconds timeout{0};
  bool async = false;
};
struct AllToAllOptions {
  // Elements this rank sends to / receives from each rank (size() entries each); empty means
  // an even split of input / output.
  std::vector<int64_t> send_counts = {};
  std::vector<int64_t> recv_counts = {};
  Nanoseconds timeout{0};
  bool async = false;
};
struct SendOptions {
  int tag = 0;
  Nanoseconds timeout{0};
  bool async = false;
};
struct RecvOptions {
  int tag = 0;
  Nanoseconds timeout{0};
  bool async = false;
};
struct BarrierOptions {
  Nanoseconds timeout{0};
  bool async = false;
};
struct SplitOptions {
  std::string name = {};  // empty: "<parent>/<color>"
  Nanoseconds timeout{0};
  // The parent ranks of the caller's new group, in new-rank order, when every rank already knows
  // its group (DeviceMesh computes them from the layout). Skips the exchange of (color, key) —
  // the only way to split the fake backend, and one all_gather less elsewhere. Every member must
  // pass the same list; empty: exchange colours and keys.
  std::vector<int> members = {};
};

// What a group is made with; rank and size come from the backend.
struct ProcessGroupOptions {
  std::string name = "world";
  uint64_t id = 0;         // flight-recorder group id; the same on every member rank
  Nanoseconds timeout{0};  // default per-call timeout; 0: TESSEL_PG_TIMEOUT (default 5m)
};

// options.timeout, or TESSEL_PG_TIMEOUT when it is zero. Throws InvalidArgument when negative or
// when the variable does not parse.
Nanoseconds resolve_group_timeout(const ProcessGroupOptions& options);

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // Made by the backends' factories (threads::create_world, gloo::create_process_group,
  // mpi::create_world, nccl::create_process_group, fake::create_process_group).
  // `global_ranks` lists the world rank of every member in group-rank order.
  ProcessGroup(std::unique_ptr<CommBackend> backend, ProcessGroupOptions options,
               std::vector<int> global_ranks);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  uint64_t id() const { return options_.id; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  std::string_view backend_name() const;
  // The device of tensors that carry small host values (shapes, hashes, flags, a logged loss)
  // through this group: the CPU, or the GPU of an NCCL group, which moves device memory only
  // (PyTorch's default device of a group). Tensors on it are valid for every collective here.
  Device default_device() const;
  Nanoseconds default_timeout() const { return options_.timeout; }
  // Collectives issued so far (the next one gets seq() + 1).
  uint64_t seq() const;

  // In-place reduction of `tensor` across the group. Every rank passes the same numel and dtype.
  Work all_reduce(Tensor& tensor, const AllReduceOptions& options = {});
  // Copies root's `tensor` into every rank's `tensor`.
  Work broadcast(Tensor& tensor, const BroadcastOptions& options = {});
  // Concatenates every rank's `input` into `output` in rank order.
  Work all_gather(const Tensor& input, Tensor& output, const AllGatherOptions& options = {});
  // Reduces `input` across ranks and leaves rank r's slice of the result in `output`.
  Work reduce_scatter(const Tensor& input, Tensor& output,
                      const ReduceScatterOptions& options = {});
  // Rank r's slice j of `input` lands in rank j's slice r of `output`.
  Work all_to_all(const Tensor& input, Tensor& output, const AllToAllOptions& options = {});
  // The list form, over views: inputs[j] goes to rank j and outputs[j] receives rank j's
  // inputs[rank()] (size() tensors each, one dtype, any strides; elements travel in row-major
  // order, so the two views of a pair may differ in shape but not in numel). A backend packs and
  // unpacks strided views as it goes (Gloo: piece by piece, overlapped with the transfer);
  // inputs[rank()] is copied into outputs[rank()] locally. Outputs must not overlap each other
  // or the inputs. options.send_counts and recv_counts must be empty (the views give them).
  Work all_to_all(std::vector<Tensor> inputs, std::vector<Tensor> outputs,
                  const AllToAllOptions& options = {});
  // Point to point; `peer` is a group rank; matched with the peer's recv/send of the same tag.
  Work send(const Tensor& tensor, int peer, const SendOptions& options = {});
  Work recv(Tensor& tensor, int peer, const RecvOptions& options = {});
  Work barrier(const BarrierOptions& options = {});

  // Collective over the group: ranks passing the same color form a new group ordered by (key,
  // old rank). Returns null for ranks passing kNoColor. Blocks; throws as the collectives do.
  std::shared_ptr<ProcessGroup> split(int color, int key, const SplitOptions& options = {});

  // Fails everything queued and in flight (also on the device) with CommError(reason) and asks
  // the backend to abort its communicator (a no-op where the backend cannot). The group is
  // unusable afterwards.
  void abort(const std::string& reason);
  bool aborted() const;
  // abort() of several groups at once (DeviceMesh::abort): every group is marked aborted first,
  // then the backends of each kind go down in one call (NCCL: every communicator inside one
  // ncclGroupStart/ncclGroupEnd). Null and repeated groups are skipped.
  static void abort_together(std::span<const std::shared_ptr<ProcessGroup>> groups,
                             const std::string& reason);

  // For the watchdog: the group ranks the backend knows have not reached collective `seq`
  // (empty when it cannot know).
  std::vector<int> missing_ranks(uint64_t seq) const;
  // How messages name members of this group: "world ranks 2,4 (group ranks 1,2)", or "world
  // rank 2 (group rank 1)" for one. Group ranks outside the group are named as such.
  std::string describe_members(const std::vector<int>& group_ranks) const;
  // The operation now in the execution slot, null when none: what the watchdog times.
  std::shared_ptr<WorkState> running() const;
  // For the watchdog: polls the device part of the operations in flight on the device, oldest
  // first, without blocking. Completes those whose end events completed and drops them from the
  // list; fails those whose device or transport reported an error (flight recorder, dump hook,
  // then the group is aborted, whatever the policy: a failed device operation leaves kernels
  // that only an abort stops). Returns those still running, for their timeouts.
  std::vector<std::shared_ptr<WorkState>> poll_device_work();

  // The transport behind this group (for backend tests and for run_ranks to abort it).
  CommBackend& backend() const { return *backend_; }

 private:
  struct Call;
  Work issue(Call call);
  // Runs `call` in the execution slot; `recorded_started`: the flight-recorder entry was made
  // already started (an inline call), else it is marked started here.
  void execute(const std::shared_ptr<WorkState>& state, Call& call, bool recorded_started);
  std::string abort_reason() const;
  // Marks the group aborted and fails its operations in flight on the device; false when it
  // already was. The backend is left to the caller.
  bool mark_aborted(const std::string& reason);
  // Fails `work`, in flight on the device, with the error its device part reported.
  void fail_device_work(WorkState& work, std::exception_ptr error);
  Nanoseconds timeout_of(Nanoseconds requested) const;
  // `op` ("all_gather") and `role` ("input", or empty) name the tensor in errors.
  void check_tensor(const Tensor& tensor, std::string_view op, std::string_view role = {}) const;
  // Both tensors valid for this backend and of one dtype.
  void check_pair(const Tensor& input, const Tensor& output, std::string_view op) const;

  std::unique_ptr<CommBackend> backend_;
  const ProcessGroupOptions options_;
  const std::vector<int> global_ranks_;
  const int rank_;
  const int size_;
  // For messages: the members as world ranks ("world ranks 0-3"), shared with every WorkState,
  // and this process in both numberings ("world rank 2; group rank 1 of 4").
  const std::shared_ptr<const std::string> members_text_;
  const std::string who_;
  mutable std::mutex mutex_;
  uint64_t seq_ = 0;                           // guarded by mutex_
  std::vector<uint64_t> send_seq_, recv_seq_;  // per peer, guarded by mutex_
  uint64_t split_count_ = 0;                   // guarded by mutex_
  std::atomic<bool> aborted_{false};           // written under mutex_, read without
  std::atomic<bool> transport_failed_{false};  // an operation failed in the transport
  std::atomic<bool> destroying_{false};        // the destructor runs the queue's last tasks
  bool watched_ = false;                       // registered with the watchdog; guarded by mutex_
  mutable std::mutex running_mutex_;
  std::shared_ptr<WorkState> running_;  // guarded by running_mutex_
  // Operations whose device part may still run, in issue order; guarded by running_mutex_.
  std::deque<std::shared_ptr<WorkState>> in_flight_;
  std::string abort_reason_;  // guarded by mutex_
  std::unique_ptr<internal::GroupWorker> worker_;
};

}  // namespace tessel
