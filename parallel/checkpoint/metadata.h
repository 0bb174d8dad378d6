#pragma once
// The metadata file of a distributed checkpoint (DIR/metadata.json): for every tensor its
// global shape and dtype and, for every shard, the box it covers (offsets and sizes per
// dimension), the file holding it and its byte range there; plus the step, each rank's
// generator states, the files' sizes and the saved metadata strings.
//
//   {"format": "tessel-checkpoint", "version": 1, "step": 100, "world_size": 4,
//    "metadata": {"data.position": "..."},
//    "generators": {"default": [[1, 4096], [1, 4096], [1, 4096], [1, 4096]]},
//    "files": {"rank_00000.safetensors": 26112, ...},
//    "tensors": {"model.transformer.wte.weight": {"dtype": "F32", "shape": [256, 96],
//        "saved_from": "mesh (dp=4), placements (Shard(0))",
//        "shards": [{"offsets": [0, 0], "sizes": [64, 96], "file": "rank_00000.safetensors",
//                    "byte_range": [184, 24760]}, ...]}}}
//
// Thread-safety: plain values; the functions share no state.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::checkpoint {

inline constexpr const char* kMetadataFileName = "metadata.json";
inline constexpr int kFormatVersion = 1;

// One shard: the box [offsets, offsets + sizes) of the global tensor, stored row-major in
// `file` at bytes [begin, end).
struct ShardRecord {
  Shape offsets;
  Shape sizes;
  std::string file;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct TensorRecord {
  DType dtype = DType::kF32;
  Shape shape;
  std::string saved_from;  // the layout it was saved from, for people ("replicated", a spec)
  std::vector<ShardRecord> shards;
};

struct CheckpointMetadata {
  int64_t step = 0;
  int world_size = 1;
  std::map<std::string, std::string> metadata;
  // Per generator, each rank's (seed, offset), world_size entries.
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> generators;
  std::map<std::string, uint64_t> files;  // file name -> size in bytes
  std::map<std::string, TensorRecord> tensors;

  std::string to_json() const;
  // Parses and validates `text` (`source` names it in errors): the format and version, every
  // shard inside its tensor and the shards tiling it exactly (no gap, no overlap), every byte
  // range the size of its box and inside its file. Throws InvalidArgument naming the source
  // and the tensor.
  static CheckpointMetadata parse(const std::string& text, const std::string& source);
};

// Reads DIR/metadata.json. Throws IoError when it cannot be read, InvalidArgument when it is
// not valid (naming the file).
CheckpointMetadata read_checkpoint_metadata(const std::string& dir);

}  // namespace tessel::checkpoint
