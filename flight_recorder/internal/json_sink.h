#pragma once
// A JSON text writer over a fixed buffer that never allocates (in fd mode) and calls only
// async-signal-safe functions (write(2)), so the fatal-signal dump and the normal dump share one
// formatter and cannot drift apart.
//
// Not thread-safe: one writer per sink.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessel::fr::internal {

class JsonSink {
 public:
  // Writes to `fd` through `buffer` (caller-owned, at least 256 bytes). No allocation.
  JsonSink(int fd, char* buffer, size_t size) noexcept : fd_(fd), buf_(buffer), size_(size) {}
  // Appends to `out` through `buffer` (may allocate; not for signal handlers).
  JsonSink(std::string* out, char* buffer, size_t size) noexcept
      : out_(out), buf_(buffer), size_(size) {}
  ~JsonSink() { flush(); }
  JsonSink(const JsonSink&) = delete;
  JsonSink& operator=(const JsonSink&) = delete;

  JsonSink& raw(std::string_view text) noexcept;
  JsonSink& str(std::string_view text) noexcept;  // quoted, escaped
  JsonSink& i64(int64_t value) noexcept;
  JsonSink& u64(uint64_t value) noexcept;
  JsonSink& hex(uint64_t value) noexcept;  // quoted "0x..."
  JsonSink& boolean(bool value) noexcept { return raw(value ? "true" : "false"); }
  // "name": (the caller writes the value); a leading comma unless `first`.
  JsonSink& key(std::string_view name, bool first = false) noexcept;

  // Pushes the buffer out; false once any write failed (sticky).
  bool flush() noexcept;
  bool ok() const noexcept { return ok_; }

 private:
  void put(char c) noexcept {
    if (used_ == size_) flush();
    buf_[used_++] = c;
  }

  int fd_ = -1;
  std::string* out_ = nullptr;
  char* buf_;
  size_t size_;
  size_t used_ = 0;
  bool ok_ = true;
};

}  // namespace tessel::fr::internal
