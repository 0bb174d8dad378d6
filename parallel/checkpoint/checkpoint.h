#pragma once
// Distributed checkpoints: each rank writes its own shards as safetensors files (replicated
// data once), one metadata file records where every shard lies, the checkpoint appears under
// its final name only when every rank has finished (atomic commit), and a load reshards onto
// whatever mesh and placements the loading job has, reading only the byte ranges it needs.
//
//   CheckpointState state(world);                               // world: null in one process
//   state.add_model("model", model);                             // FSDP / TP shards as they are
//   state.add_optimizer("optim", opt, model);                    // moments take the params' specs
//   state.add_generator("default", default_generator());
//   state.step = step;
//   state.metadata["data.position"] = ...;
//
//   Checkpointer ckpt(world, "/ckpt", {.keep_last = 3});        // collective (a private group)
//   Work w = ckpt.async_save(state);    // snapshot to host memory now; written in the background
//   ... train on; w.wait() or the next async_save waits for it ...
//   if (auto dir = ckpt.load_latest(state)) { ... state.step, state.metadata restored ... }
//
// On disk (docs/parallel.md, "Checkpoints"): ROOT/step_<N>/ holds metadata.json and
// rank_<R>.safetensors per rank that writes data; a save in progress lives in a hidden
// ROOT/.step_<N>.tmp-<nonce>/ and is renamed into place by rank 0 after every rank reported
// its files written and fsync'ed, so a crash anywhere leaves the previous checkpoints intact and
// a partial one is never a step_<N>.
//
// Collective rules: save, async_save's commit, load and load_latest are collectives over the
// state's group: every rank calls them in the same order with states of the same names, specs
// and generators — or, with CheckpointState::ranks_hold_different_tensors (pipeline stages),
// each with the tensors it holds and the same generators and optimizers. A failure on one rank (a
// bad file, a full disk) fails the call on every rank with a message naming that rank.
// Thread-safety: a Checkpointer is used by one thread (its writer thread is internal); a
// CheckpointState refers to tensors and generators it does not own.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessel/collectives/work.h"
#include "tessel/nn/module.h"
#include "tessel/nn/optim/optimizer.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/tensor/random.h"

namespace tessel {

class ProcessGroup;

namespace checkpoint {

// One tensor of a checkpoint: this rank's local tensor and, for a DTensor, the spec saying where
// it lies (null: a plain tensor, the same on every rank of the group). `logical_shape`, when
// set, is the shape the tensor is saved and loaded in: its global shape with leading dimensions
// folded into one — tensor parallelism keeps GPT-2's fused (3C, C) c_attn weight as (3, C, C)
// so that each rank holds a slice of q, k and v, and the checkpoint keeps it (3C, C), loadable
// into the model however it is parallelised.
struct StateTensor {
  std::string name;
  Tensor local;
  std::shared_ptr<const DTensorSpec> spec;
  Shape logical_shape;
};

// What a checkpoint holds. Tensors are saved from and loaded into in place (their handles are
// kept), generators are restored in place (seed and offset), step and metadata are replaced on
// load. Metadata is the same on every rank (rank 0's is recorded): the data position, user
// notes; the keys "tessel.*" are reserved.
class CheckpointState {
 public:
  // `group`: every rank that holds part of the state (the world the meshes were made over);
  // null for a single process.
  explicit CheckpointState(std::shared_ptr<ProcessGroup> group = nullptr);

  // Adds `t` under `name` (a plain tensor, or a parameter carrying a DTensor spec: FSDP's and
  // tensor parallelism's sharded parameters). Throws InvalidArgument for a duplicate name.
  void add_tensor(const std::string& name, const Tensor& t);
  void add_tensor(const std::string& name, const DTensor& t);
  // Adds a tensor described in full (a local tensor with its spec and logical shape).
  void add(StateTensor t);
  // Adds every entry as "<prefix>.<name>" (prefix empty: the names as they are).
  void add_tensors(const std::string& prefix,
                   const std::vector<std::pair<std::string, DTensor>>& tensors);
  void add_tensors(const std::string& prefix, const nn::StateDict& tensors);
  // Every parameter and buffer of `model` as "<prefix>.<name>", in the shape a whole state dict
  // of the model has (module-recorded shapes: see StateTensor::logical_shape) — the way to add a
  // model that tensor parallelism or FSDP has sharded. A name already added with the same tensor
  // is skipped, so the several pipeline stages of one rank (which may share a tied embedding)
  // are added one after another.
  void add_model(const std::string& prefix, nn::Module& model);
  // The optimizer's state of each parameter of `model` as "<prefix>.<param>.<state>" (AdamW:
  // exp_avg, exp_avg_sq), with the parameter's spec and logical shape, and its step count (restored
  // on load). Parameters are matched to the optimizer's by identity; throws InvalidArgument naming
  // one that the optimizer does not hold. As add_model, state already added with the same tensor
  // is skipped (one optimizer over several stages: call it once per stage).
  void add_optimizer(const std::string& prefix, nn::optim::Optimizer& optimizer, nn::Module& model);
  // A generator's (seed, offset), saved per rank and restored in place.
  void add_generator(const std::string& name, Generator& generator);

  const std::shared_ptr<ProcessGroup>& group() const { return group_; }
  const std::vector<StateTensor>& tensors() const { return tensors_; }
  const std::vector<std::pair<std::string, Generator*>>& generators() const { return generators_; }
  // The optimizers added, by prefix (their step counts are saved and restored).
  const std::vector<std::pair<std::string, nn::optim::Optimizer*>>& optimizers() const {
    return optimizers_;
  }

  int64_t step = 0;
  std::map<std::string, std::string> metadata;
  // False: every rank adds the same tensors (each its shard of them). True: ranks may hold
  // different tensors — the stages of a pipeline, each rank adding its stages' parameters and
  // optimizer state under the whole model's names. A save then exchanges every rank's names,
  // shapes and boxes once and writes their union (each distinct box once, by one of its holders);
  // it throws InvalidArgument on every rank when holders of a name disagree on its dtype or
  // shape, or when some elements of a tensor are held by no rank. A load reads into each rank the
  // names it holds (the checkpoint's other tensors are ignored, as always). Generators and
  // optimizers must still be the same on every rank.
  bool ranks_hold_different_tensors = false;

 private:
  // True when `name` was added with the tensor `local` (the same object).
  bool holds(const std::string& name, const Tensor& local) const;

  std::shared_ptr<ProcessGroup> group_;
  std::vector<StateTensor> tensors_;
  std::vector<std::pair<std::string, Generator*>> generators_;
  std::vector<std::pair<std::string, nn::optim::Optimizer*>> optimizers_;
};

struct SaveOptions {
  // How long a rank waits for the others at each step of the commit (a rank that died or hangs
  // fails the save with Timeout or PeerLost instead of blocking it forever).
  Nanoseconds timeout = std::chrono::minutes(10);
};

struct LoadOptions {
  Nanoseconds timeout = std::chrono::minutes(10);
};

// Writes `state` as a checkpoint at `dir` (which must not exist yet, or is replaced atomically),
// synchronously on the calling thread; collective over state.group(). Throws InvalidArgument
// for a Partial DTensor or a state whose ranks disagree, IoError naming the file and rank when
// writing fails, Timeout/PeerLost when a rank does not finish; in every case `dir` is untouched.
void save(const CheckpointState& state, const std::string& dir, const SaveOptions& options = {});

// Loads the checkpoint at `dir` (a checkpoint folder, or a root whose latest committed
// checkpoint is taken) into `state`, resharding each tensor onto its current spec. Every tensor
// of the state must be in the checkpoint with the same global shape and dtype (the checkpoint
// may hold more). Everything is validated — metadata, each needed file's size and header —
// on every rank before any tensor is written; a problem throws InvalidArgument (or IoError)
// naming the file and tensor, on every rank, with the state untouched. Collective.
void load(CheckpointState& state, const std::string& dir, const LoadOptions& options = {});

// The newest committed checkpoint under `root` (step_<N> with the largest N holding a
// metadata file), or nullopt. Never returns a save in progress.
std::optional<std::string> latest_checkpoint(const std::string& root);
// Every committed checkpoint under `root`, oldest first, as (step, path).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root);
// "step_00000100": the folder name of a step.
std::string step_dir_name(int64_t step);

struct CheckpointerOptions {
  int keep_last = 0;  // committed checkpoints kept under the root (0: all)
  Nanoseconds timeout = std::chrono::minutes(10);
};

// Periodic checkpoints of a training job under one root (ROOT/step_<N>), written in the
// background with keep-last-N retention.
//
// Thread-safety: one thread calls its methods. Ownership: owns a private process group (split
// from `group` at construction, so its commit collectives never interleave with training's) and
// the writer thread, joined by wait() and the destructor. The writer's collectives are recorded
// as the "checkpoint writer" thread's (fr::ThreadScope), outside the training loop's steps.
class Checkpointer {
 public:
  // Collective over `group` (null: one process): makes the private group.
  Checkpointer(std::shared_ptr<ProcessGroup> group, std::string root,
               CheckpointerOptions options = {});
  // Waits for a save in flight (a failed save is logged when it fails, not thrown here). While
  // an exception unwinds, or once `group` was aborted, it first aborts the private group, so a
  // save whose peers are lost fails at once instead of waiting out its timeouts.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Waits for the previous save, copies this rank's share of `state` to host memory (the only
  // part that stalls training), and returns while a background thread writes and commits
  // ROOT/step_<state.step>. The Work completes when the checkpoint is committed on every rank,
  // or fails with the save's error. state's group must be the one given at construction.
  Work async_save(const CheckpointState& state);
  // async_save and wait.
  void save(const CheckpointState& state);
  // Waits for the save in flight and rethrows its error.
  void wait();

  // Loads the latest committed checkpoint (rank 0 chooses; collective) and returns its path,
  // or nullopt (state untouched) when there is none.
  std::optional<std::string> load_latest(CheckpointState& state, const LoadOptions& options = {});

  const std::string& root() const { return root_; }

 private:
  class Writer;
  // Rank 0, after a commit: removes the oldest checkpoints beyond keep_last.
  void retain();

  std::shared_ptr<ProcessGroup> user_group_;  // the group states must name
  std::shared_ptr<ProcessGroup> group_;       // the private group (null: one process)
  std::string root_;
  CheckpointerOptions options_;
  std::unique_ptr<Writer> writer_;
};

// Writes the tensors of the checkpoint at `dir` whose names start with `prefix` as one
// safetensors file at `out` (the prefix removed: "model." gives the model's own names, for
// Module::load), assembling each whole tensor from its shards one at a time. Returns the number
// of tensors written. Throws as load does for missing or bad files, InvalidArgument when no name
// has the prefix.
int64_t consolidate(const std::string& dir, const std::string& out,
                    const std::string& prefix = "model.");

}  // namespace checkpoint
}  // namespace tessel
