// consolidate(): a sharded checkpoint's tensors as one safetensors file, written as a stream
// (the header first, then each whole tensor assembled from its shards, one at a time).
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "tessel/base/error.h"
#include "tessel/base/unique_fd.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/checkpoint/internal/files.h"
#include "tessel/parallel/checkpoint/internal/reader.h"
#include "tessel/parallel/checkpoint/metadata.h"
#include "tessel/tensor/ops.h"

namespace tessel::checkpoint {

int64_t consolidate(const std::string& dir, const std::string& out, const std::string& prefix) {
  std::string path = dir;
  if (!std::filesystem::exists(std::filesystem::path(dir) / kMetadataFileName)) {
    const auto latest = latest_checkpoint(dir);
    TESSEL_CHECK(latest.has_value(), InvalidArgument,
                 "consolidate: {} is neither a checkpoint nor a folder of committed checkpoints",
                 dir);
    path = *latest;
  }
  const CheckpointMetadata meta = read_checkpoint_metadata(path);
  internal::ShardReader reader(path, meta);
  // Validate every file first, so a bad checkpoint writes nothing.
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> source_of;  // output name -> checkpoint name
  for (const auto& [name, t] : meta.tensors) {
    if (!name.starts_with(prefix) || name.size() == prefix.size()) continue;
    reader.check(name, {Shape(t.shape.size(), 0), t.shape});
    const std::string short_name = name.substr(prefix.size());
    entries.push_back({short_name, t.dtype, t.shape, 0, 0});
    source_of[short_name] = name;
  }
  TESSEL_CHECK(!entries.empty(), InvalidArgument,
               "consolidate: no tensor of {} starts with '{}' (it holds {} tensors)", path, prefix,
               meta.tensors.size());
  const SafetensorsLayout layout =
      plan_safetensors(entries, {{"format", "pt"}, {"step", std::to_string(meta.step)}});

  // Stream into a temporary file next to `out`, renamed over it once complete.
  const std::string tmp = out + ".tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw_system_error(fmt::format("{}: cannot create", tmp), errno);
    auto write_bytes = [&](const void* data, size_t bytes) {
      const auto* p = static_cast<const std::byte*>(data);
      while (bytes > 0) {
        const ssize_t n = ::write(fd.get(), p, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_system_error(fmt::format("{}: writing", tmp), errno);
        p += n;
        bytes -= static_cast<size_t>(n);
      }
    };
    write_bytes(layout.header.data(), layout.header.size());
    for (const SafetensorsEntry& e : layout.entries) {
      const Tensor whole = empty(e.shape, e.dtype, Device::cpu());
      reader.read(source_of.at(e.name), {Shape(e.shape.size(), 0), e.shape}, whole);
      write_bytes(whole.data_ptr(), whole.nbytes());
    }
    if (::fsync(fd.get()) != 0) throw_system_error(fmt::format("{}: fsync", tmp), errno);
  }
  if (::rename(tmp.c_str(), out.c_str()) != 0) {
    throw_system_error(fmt::format("rename {} to {}", tmp, out), errno);
  }
  return static_cast<int64_t>(layout.entries.size());
}

}  // namespace tessel::checkpoint
