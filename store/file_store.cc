#include "tessel/store/file_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "tessel/base/error.h"
#include "tessel/store/memory_store.h"

namespace tessel {
namespace {

// Polls for a file: 1 ms doubling to 32 ms.
Backoff file_backoff() {
  return Backoff(std::chrono::milliseconds(1), std::chrono::milliseconds(32));
}

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The store's lock file, flock'd for the object's lifetime.
class FileLock {
 public:
  FileLock(const std::string& path, Nanoseconds timeout) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_system_error("FileStore: open " + path, errno);
    const Deadline deadline = Deadline::after(timeout);
    Backoff backoff = file_backoff();
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        const int err = errno;
        ::close(fd_);
        throw_system_error("FileStore: flock " + path, err);
      }
      if (deadline.expired()) {
        ::close(fd_);
        throw Timeout(fmt::format("FileStore: lock {} not acquired within {}", path,
                                  format_duration(timeout)));
      }
      backoff.pause(deadline);
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

FileStore::FileStore(std::string directory, Nanoseconds default_timeout)
    : Store(default_timeout), directory_(std::move(directory)) {
  TESSEL_CHECK(!directory_.empty(), InvalidArgument, "FileStore: the directory is empty");
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  if (ec) {
    throw IoError(fmt::format("FileStore: cannot create {}: {}", directory_, ec.message()));
  }
}

std::string FileStore::path_of(const std::string& key) const {
  // Hex keeps any key (slashes, dots) a plain file name.
  std::string name = "k_";
  for (unsigned char c : key) name += fmt::format("{:02x}", c);
  return directory_ + "/" + name;
}

void FileStore::write_atomically(const std::string& key, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string final_path = path_of(key);
  const std::string tmp = fmt::format("{}/.tmp.{}.{}", directory_, ::getpid(), counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) throw_system_error("FileStore: write " + tmp, errno);
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_system_error("FileStore: rename to " + final_path, err);
  }
}

void FileStore::set(const std::string& key, const std::string& value) {
  write_atomically(key, value);
}

std::string FileStore::get(const std::string& key, Nanoseconds timeout) {
  return multi_get({key}, timeout).front();
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  FileLock lock(directory_ + "/.lock", timeout());
  int64_t value = 0;
  if (auto text = read_file(path_of(key))) {
    const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
    TESSEL_CHECK(ec == std::errc() && end == text->data() + text->size(), InvalidArgument,
                 "FileStore::add: key '{}' holds '{}', not a decimal integer", key, *text);
  }
  value = add_store_counter(key, value, delta);
  write_atomically(key, std::to_string(value));
  return value;
}

std::string FileStore::compare_set(const std::string& key, const std::string& expected,
                                   const std::string& desired) {
  FileLock lock(directory_ + "/.lock", timeout());
  const auto current = read_file(path_of(key));
  if ((!current && expected.empty()) || (current && *current == expected)) {
    write_atomically(key, desired);
    return desired;
  }
  return current.value_or("");
}

void FileStore::wait(const std::vector<std::string>& keys, Nanoseconds timeout) {
  const Deadline deadline = Deadline::after(timeout);
  Backoff backoff = file_backoff();
  for (;;) {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (::access(path_of(key).c_str(), F_OK) != 0) missing.push_back(key);
    }
    if (missing.empty()) return;
    if (deadline.expired()) {
      throw Timeout(fmt::format("FileStore {}: key(s) {} not set within {}", directory_, missing,
                                format_duration(timeout)));
    }
    backoff.pause(deadline);
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (::access(path_of(key).c_str(), F_OK) != 0) return false;
  }
  return true;
}

bool FileStore::delete_key(const std::string& key) { return ::unlink(path_of(key).c_str()) == 0; }

std::vector<std::string> FileStore::multi_get(const std::vector<std::string>& keys,
                                              Nanoseconds timeout) {
  wait(keys, timeout);
  std::vector<std::string> values;
  for (const auto& key : keys) {
    auto value = read_file(path_of(key));
    // A key deleted between wait and read is reported like one that never appeared.
    if (!value) {
      throw Timeout(
          fmt::format("FileStore {}: key '{}' vanished while being read", directory_, key));
    }
    values.push_back(std::move(*value));
  }
  return values;
}

void FileStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) {
  TESSEL_CHECK(keys.size() == values.size(), InvalidArgument,
               "FileStore::multi_set: {} keys but {} values", keys.size(), values.size());
  for (size_t i = 0; i < keys.size(); ++i) write_atomically(keys[i], values[i]);
}

}  // namespace tessel
