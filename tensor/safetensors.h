#pragma once
// safetensors I/O: the weight format PyTorch and Hugging Face users exchange. A file is an
// 8-byte little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and
// [begin, end) byte range in the data area, then the data area:
//
//   {"wte.weight": {"dtype": "F32", "shape": [256, 64], "data_offsets": [0, 65536]},
//    "__metadata__": {"step": "100"}}
//
//   save_safetensors("ckpt.safetensors", {{"w", w}}, {{"step", "100"}});
//   SafetensorsFile f = load_safetensors("ckpt.safetensors");
//   Tensor w2 = f.tensors.at("w");
//
// Supported dtypes: F32, BF16, F16, I64, I32, BOOL. The loader validates the whole header before
// reading any data: a truncated, oversized or malicious file gives an InvalidArgument (or
// IoError when the file cannot be read) naming the file and the problem, never an out-of-bounds
// read. Functions are thread-safe (no shared state).

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel {

// Tensors by name, sorted by name (the order they are written in).
using TensorMap = std::map<std::string, Tensor>;

// What a safetensors file holds.
struct SafetensorsFile {
  TensorMap tensors;                            // each a fresh contiguous CPU tensor
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" string map
};

// The largest header the loader accepts (the limit the reference implementation uses).
inline constexpr size_t kSafetensorsMaxHeaderBytes = 100u << 20;

// Writes `tensors` (any strides; CPU only) and `metadata` to `path`, replacing the file.
// The header is padded with spaces to a multiple of 8 bytes so the data area stays aligned.
// Throws InvalidArgument for a name that is empty or "__metadata__", or a non-CPU tensor;
// IoError when the file cannot be written.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a whole file written by save_safetensors, PyTorch or Hugging Face. Throws as described
// in the file comment; every message starts with the path.
SafetensorsFile load_safetensors(const std::string& path);

// The bytes save_safetensors writes, and their inverse. `source` names the bytes in error
// messages (a path, "<memory>"). For tests and fuzzing.
std::string serialize_safetensors(const TensorMap& tensors,
                                  const std::map<std::string, std::string>& metadata = {});
SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, std::string_view source);

// --- Partial reads and streaming writes (sharded checkpoints) ---------------------------------
//
// A file's tensors are addressed by absolute byte ranges, so a reader can pread only the bytes
// it needs and a writer can lay out a file before it has the data:
//
//   SafetensorsIndex index = read_safetensors_index("rank_00001.safetensors");  // header only
//   const SafetensorsEntry& e = index.entries.at("w");     // e.begin: w's first byte in the file
//
//   SafetensorsLayout layout = plan_safetensors({{"w", DType::kF32, {4, 8}}});
//   // write layout.header, then each entry's bytes at layout.entries[i].begin (name order)

// One tensor of a header: dtype, shape and its bytes [begin, end) counted from the start of
// the file (not of the data area).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// What a header says, validated as load_safetensors validates it (against the file's size).
struct SafetensorsIndex {
  std::map<std::string, SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
  uint64_t file_bytes = 0;  // the file's size
};

// Reads and validates the header of `path` without reading the data area. Throws as
// load_safetensors does (a truncated file is an InvalidArgument naming the path).
SafetensorsIndex read_safetensors_index(const std::string& path);

// The header of a file holding `tensors` (name, dtype, shape; begin/end ignored): the bytes to
// write first (length prefix and padded JSON, as save_safetensors writes them), and each tensor
// with its absolute byte range, sorted by name (the order of the data area).
struct SafetensorsLayout {
  std::string header;
  std::vector<SafetensorsEntry> entries;
  uint64_t file_bytes = 0;
};
SafetensorsLayout plan_safetensors(const std::vector<SafetensorsEntry>& tensors,
                                   const std::map<std::string, std::string>& metadata = {});

// "F32", "BF16", ...: the dtype's name in safetensors headers.
std::string_view safetensors_dtype_name(DType dtype);

}  // namespace tessel
