#include "tessel/parallel/checkpoint/internal/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <mutex>

#include "tessel/base/error.h"
#include "tessel/base/unique_fd.h"

namespace tessel::checkpoint::internal {
namespace {

std::mutex hook_mu;
FaultHook hook;

// Writes all of `bytes` to `fd` (large writes in pieces, retrying short writes and EINTR).
void write_all(int fd, const std::byte* data, size_t bytes, const std::string& path) {
  constexpr size_t kPiece = size_t{64} << 20;
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd, data + done, std::min(kPiece, bytes - done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw_system_error(fmt::format("{}: writing {} bytes at {}", path, bytes - done, done),
                         errno);
    done += static_cast<size_t>(n);
  }
}

std::string parent_of(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

void write_file_durably(const std::string& path,
                        std::span<const std::span<const std::byte>> pieces) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw_system_error(fmt::format("{}: cannot create", path), errno);
  size_t total = 0;
  for (const auto& piece : pieces) total += piece.size();
  // The piece holding the middle byte is written in two parts, with the fault point between.
  size_t done = 0;
  bool mid = false;
  for (const auto& piece : pieces) {
    size_t split = piece.size();
    if (!mid && done + piece.size() >= total / 2) split = total / 2 - done;
    write_all(fd.get(), piece.data(), split, path);
    if (split < piece.size() || (!mid && done + split >= total / 2)) {
      mid = true;
      fault_point("write.mid");
      write_all(fd.get(), piece.data() + split, piece.size() - split, path);
    }
    done += piece.size();
  }
  if (::fsync(fd.get()) != 0) throw_system_error(fmt::format("{}: fsync", path), errno);
}

void fsync_dir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_system_error(fmt::format("{}: cannot open the directory", dir), errno);
  if (::fsync(fd.get()) != 0) throw_system_error(fmt::format("{}: fsync", dir), errno);
}

void pread_exact(int fd, void* out, uint64_t bytes, uint64_t offset, const std::string& path) {
  auto* p = static_cast<std::byte*>(out);
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, p + done, std::min<uint64_t>(bytes - done, uint64_t{1} << 30),
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw_system_error(fmt::format("{}: reading {} bytes at offset {}", path, bytes, offset),
                         errno);
    }
    TESSEL_CHECK(n > 0, IoError, "{}: the file ends before byte {} (reading {} bytes at {})", path,
                 offset + done, bytes, offset);
    done += static_cast<uint64_t>(n);
  }
}

void replace_dir(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    if (errno != ENOTEMPTY && errno != EEXIST) {
      throw_system_error(fmt::format("rename {} to {}", from, to), errno);
    }
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0) {
      throw_system_error(fmt::format("exchange {} with {}", from, to), errno);
    }
    fsync_dir(parent_of(to));
    remove_tree(from);
  }
  fsync_dir(parent_of(to));
}

void remove_tree(const std::string& path, const std::string& hide_as) {
  std::string target = path;
  if (!hide_as.empty()) {
    if (::rename(path.c_str(), hide_as.c_str()) != 0) {
      throw_system_error(fmt::format("rename {} to {}", path, hide_as), errno);
    }
    fsync_dir(parent_of(hide_as));
    target = hide_as;
  }
  std::error_code ec;
  std::filesystem::remove_all(target, ec);
  if (ec) throw IoError(fmt::format("{}: cannot remove: {}", target, ec.message()));
}

void set_fault_hook(FaultHook h) {
  std::lock_guard<std::mutex> lock(hook_mu);
  hook = std::move(h);
}

void fault_point(std::string_view point) {
  FaultHook h;
  {
    std::lock_guard<std::mutex> lock(hook_mu);
    h = hook;
  }
  if (h) h(point);
}

}  // namespace tessel::checkpoint::internal
