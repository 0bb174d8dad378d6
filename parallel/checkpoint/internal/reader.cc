#include "tessel/parallel/checkpoint/internal/reader.h"

#include <fcntl.h>
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/parallel/checkpoint/internal/files.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::checkpoint::internal {
namespace {

// Runs closer than this are read with one pread (the gap is read and dropped).
constexpr uint64_t kMaxGap = uint64_t{256} << 10;
// ... as long as the window stays below this.
constexpr uint64_t kMaxWindow = uint64_t{64} << 20;

// The byte offset of `sub` inside a row-major tensor holding `box`, when `sub` is one
// contiguous piece of it (dimensions before some k of size 1, after k whole); -1 otherwise.
int64_t contiguous_offset(const Box& box, const Box& sub, size_t element_size) {
  const size_t n = box.sizes.size();
  size_t k = n == 0 ? 0 : n - 1;
  while (k > 0 && sub.sizes[k] == box.sizes[k]) --k;
  for (size_t d = 0; d < k; ++d) {
    if (sub.sizes[d] != 1) return -1;
  }
  const Strides strides = contiguous_strides(box.sizes);
  int64_t element = 0;
  for (size_t d = 0; d < n; ++d) element += (sub.offsets[d] - box.offsets[d]) * strides[d];
  return element * static_cast<int64_t>(element_size);
}

Tensor narrow_to(const Tensor& t, const Box& box, const Box& sub) {
  Tensor out = t;
  for (size_t d = 0; d < box.sizes.size(); ++d) {
    out = narrow(out, static_cast<int64_t>(d), sub.offsets[d] - box.offsets[d], sub.sizes[d]);
  }
  return out;
}

}  // namespace

ShardReader::ShardReader(std::string dir, const CheckpointMetadata& meta)
    : dir_(std::move(dir)), meta_(meta) {}

const TensorRecord& ShardReader::record(const std::string& name) const {
  const auto it = meta_.tensors.find(name);
  TESSEL_CHECK(it != meta_.tensors.end(), InvalidArgument,
               "{}/{}: the checkpoint has no tensor '{}'", dir_, kMetadataFileName, name);
  return it->second;
}

ShardReader::File& ShardReader::open(const std::string& file, const std::string& tensor) {
  auto it = files_.find(file);
  if (it != files_.end()) return it->second;
  const std::string path = dir_ + "/" + file;
  File f;
  f.fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd.get() < 0) {
    const int err = errno;
    TESSEL_CHECK(err != ENOENT, InvalidArgument,
                 "{}: shard file of tensor '{}' is missing (the checkpoint's metadata lists it)",
                 path, tensor);
    throw_system_error(fmt::format("{}: cannot open the shard file of tensor '{}'", path, tensor),
                       err);
  }
  const uint64_t expected = meta_.files.at(file);
  const off_t size = ::lseek(f.fd.get(), 0, SEEK_END);
  if (size < 0) throw_system_error(fmt::format("{}: cannot determine its size", path), errno);
  TESSEL_CHECK(static_cast<uint64_t>(size) == expected, InvalidArgument,
               "{}: shard file of tensor '{}' holds {} bytes but the checkpoint's metadata "
               "records {} ({})",
               path, tensor, size, expected,
               static_cast<uint64_t>(size) < expected ? "truncated" : "replaced or appended to");
  f.index = read_safetensors_index(path);
  return files_.emplace(file, std::move(f)).first->second;
}

void ShardReader::check(const std::string& name, const Box& box) {
  const TensorRecord& t = record(name);
  for (const ShardRecord& s : t.shards) {
    if (!intersect({s.offsets, s.sizes}, box)) continue;
    File& f = open(s.file, name);
    const std::string path = dir_ + "/" + s.file;
    const auto e = f.index.entries.find(name);
    TESSEL_CHECK(e != f.index.entries.end(), InvalidArgument,
                 "{}: shard file holds no tensor '{}' (the checkpoint's metadata says it does)",
                 path, name);
    // The shard is the file's entry, or (a tensor saved in a logical shape) a run of it.
    const SafetensorsEntry& entry = e->second;
    TESSEL_CHECK(
        entry.dtype == t.dtype && s.begin >= entry.begin && s.end <= entry.end &&
            s.end - s.begin == static_cast<uint64_t>(shape_numel(s.sizes)) * dtype_size(t.dtype) &&
            (s.begin != entry.begin || s.end != entry.end ||
             shape_numel(entry.shape) == shape_numel(s.sizes)),
        InvalidArgument,
        "{}: tensor '{}' is {} at bytes [{}, {}) in the file but the checkpoint's "
        "metadata records {} at [{}, {})",
        path, name, typed_shape_str(entry.dtype, entry.shape), entry.begin, entry.end,
        typed_shape_str(t.dtype, s.sizes), s.begin, s.end);
  }
}

void ShardReader::read(const std::string& name, const Box& box, const Tensor& out) {
  const TensorRecord& t = record(name);
  const size_t element = dtype_size(t.dtype);
  const bool direct = out.device().is_cpu() && out.is_contiguous();
  for (const ShardRecord& s : t.shards) {
    const Box shard{s.offsets, s.sizes};
    const std::optional<Box> sub = intersect(shard, box);
    if (!sub) continue;
    File& f = open(s.file, name);
    const std::string path = dir_ + "/" + s.file;
    // Read straight into `out` when the piece is contiguous there, else into a scratch tensor
    // copied into place afterwards.
    const int64_t at = direct ? contiguous_offset(box, *sub, element) : -1;
    Tensor scratch;
    std::byte* dest = nullptr;
    if (at >= 0) {
      dest = static_cast<std::byte*>(out.data_ptr()) + at;
    } else {
      scratch = empty(sub->sizes, t.dtype, Device::cpu());
      dest = static_cast<std::byte*>(scratch.data_ptr());
    }
    const std::vector<ByteRun> runs = runs_of(shard, s.begin, element, *sub);
    std::vector<std::byte> window;
    for (size_t i = 0; i < runs.size();) {
      // Runs i..j-1 are read in one window.
      size_t j = i + 1;
      uint64_t end = runs[i].file_offset + runs[i].bytes;
      while (j < runs.size() && runs[j].file_offset - end <= kMaxGap &&
             runs[j].file_offset + runs[j].bytes - runs[i].file_offset <= kMaxWindow) {
        end = runs[j].file_offset + runs[j].bytes;
        ++j;
      }
      if (j == i + 1) {
        pread_exact(f.fd.get(), dest + runs[i].buffer_offset, runs[i].bytes, runs[i].file_offset,
                    path);
      } else {
        window.resize(end - runs[i].file_offset);
        pread_exact(f.fd.get(), window.data(), window.size(), runs[i].file_offset, path);
        for (size_t r = i; r < j; ++r) {
          std::memcpy(dest + runs[r].buffer_offset,
                      window.data() + (runs[r].file_offset - runs[i].file_offset), runs[r].bytes);
        }
      }
      bytes_read_ += end - runs[i].file_offset;
      i = j;
    }
    if (at < 0) {
      NoGradGuard no_grad;  // `out` may be a parameter: loading is not part of its history
      copy_(narrow_to(out, box, *sub), scratch);
    }
  }
}

}  // namespace tessel::checkpoint::internal
