#pragma once
// Private: the arithmetic of sharded checkpoints. Saving: which rank writes which box of each
// tensor (every distinct box once, by one of the ranks holding it, spreading the bytes), and the
// file each rank writes. Loading: the byte runs of a saved shard that fall inside a wanted box.
// Every rank computes the same save plan: from the specs alone when every DTensor's mesh spans
// the checkpoint's group, else from every rank's own boxes, exchanged once (a DTensor on a
// sub-mesh, such as FSDP over dp_shard of a (dp_shard, tp) mesh, tells a rank nothing about the
// ranks outside its sub-mesh).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/checkpoint/metadata.h"
#include "tessel/tensor/safetensors.h"

namespace tessel::checkpoint::internal {

// A box of a global tensor: [offsets, offsets + sizes) per dimension.
struct Box {
  Shape offsets;
  Shape sizes;
  bool operator==(const Box& other) const = default;
};
std::optional<Box> intersect(const Box& a, const Box& b);

// `box` of a tensor of shape `global` as boxes of its `logical` shape (`global` with dimensions
// 0..k folded into one; empty or equal: `box` itself). Box i holds the elements of `box` whose
// first k indices are the i-th combination of its sizes in row-major order: the i-th run of
// numel(box i) elements of `box`'s row-major data. Throws InvalidArgument naming `name` when
// `logical` is no such folding of `global`.
std::vector<Box> logical_boxes(const Box& box, const Shape& global, const Shape& logical,
                               const std::string& name);

// What a save plan needs of a tensor without its data (one that another rank may hold).
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;          // global
  Shape logical_shape;  // saved as (empty: `shape`)
  std::string saved_from;
};

struct PlannedTensor : TensorInfo {
  std::vector<Box> boxes;    // the distinct non-empty boxes (of `shape`)
  std::vector<int> writers;  // the group rank writing each box
  int mine = -1;             // the index of the box this rank writes, -1: none
};

struct SavePlan {
  std::vector<PlannedTensor> tensors;  // in the state's order
  // Each writing rank's file (names are tensor names), for every rank when planned with
  // all_files, else only this rank's.
  std::map<int, SafetensorsLayout> files;
};

// "rank_00003.safetensors".
std::string shard_file_name(int rank);

// Who holds what of one tensor: its distinct non-empty boxes and the group ranks holding each.
struct Holdings {
  std::vector<Box> boxes;
  std::vector<std::vector<int>> holders;
};

// True when some DTensor of `tensors` lives on a mesh of fewer ranks than `world`: its holdings
// cannot be computed from its spec and are gathered from every rank (own_boxes/gathered_holdings).
bool needs_exchange(const std::vector<StateTensor>& tensors, int world);
// This rank's box of each tensor, flattened: per tensor, its offsets then its sizes (a plain
// tensor: the whole of it). Throws InvalidArgument naming the tensor for a Partial placement.
std::vector<int64_t> own_boxes(const std::vector<StateTensor>& tensors);
// The holdings of every tensor from every rank's own_boxes (`all`: world of them back to back,
// as an all_gather gives them).
std::vector<Holdings> gathered_holdings(const std::vector<StateTensor>& tensors,
                                        const std::vector<int64_t>& all, int world);

// The plan for `tensors` held by group rank `rank` of `world`, from their specs (`holdings`
// null) or from gathered holdings. Throws InvalidArgument naming the tensor for a Partial
// placement, or for a spec whose mesh puts this process at another rank than `rank` or holds
// ranks outside the group.
SavePlan plan_save(const std::vector<StateTensor>& tensors, int rank, int world, bool all_files,
                   const std::vector<Holdings>* holdings = nullptr);

TensorInfo info_of(const StateTensor& t);
// The plan of tensors described by `infos` with `holdings` (one per info).
SavePlan plan_save(const std::vector<TensorInfo>& infos, std::vector<Holdings> holdings, int rank,
                   int world, bool all_files);

// States whose ranks hold different tensors (CheckpointState::ranks_hold_different_tensors:
// pipeline stages). Each rank describes what it holds — per tensor its TensorInfo and its own
// box — as 64-bit words (text packed 8 bytes a word); union_of takes every rank's description
// and gives the checkpoint's tensors (in order of first appearance, rank 0's first) with their
// holdings, the same on every rank. Throws InvalidArgument naming the tensor and the ranks when
// holders disagree on its dtype or shapes, when their boxes overlap, or when some elements of a
// tensor are held by no rank.
std::vector<int64_t> describe(const std::vector<StateTensor>& tensors);
struct UnionOfStates {
  std::vector<TensorInfo> infos;
  std::vector<Holdings> holdings;
  uint64_t digest = 0;  // of the infos and holdings: equal on every rank
};
UnionOfStates union_of(const std::vector<std::vector<int64_t>>& descriptions);

// The metadata rank 0 writes for `plan` (generators and strings are filled in by the caller).
CheckpointMetadata metadata_of(const SavePlan& plan, int64_t step, int world);

// A contiguous run of bytes to read: `bytes` at `file_offset` of the file, landing at
// `buffer_offset` of a row-major buffer holding the intersection box.
struct ByteRun {
  uint64_t file_offset = 0;
  uint64_t buffer_offset = 0;
  uint64_t bytes = 0;
};
// The runs of `shard` (stored row-major at byte `begin`) that make up `box` (inside it),
// elements of `element_size` bytes, in increasing file order (each as long as possible).
std::vector<ByteRun> runs_of(const Box& shard, uint64_t begin, size_t element_size, const Box& box);

// A stable 64-bit digest of what must agree across ranks for a save: names, dtypes, global
// shapes, specs (their meshes' shapes, not which ranks) and generator names.
uint64_t state_digest(const CheckpointState& state);

}  // namespace tessel::checkpoint::internal
