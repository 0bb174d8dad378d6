#include "tessel/flight_recorder/internal/json_sink.h"

#include <unistd.h>

#include <cerrno>

namespace tessel::fr::internal {

JsonSink& JsonSink::raw(std::string_view text) noexcept {
  for (char c : text) put(c);
  return *this;
}

JsonSink& JsonSink::str(std::string_view text) noexcept {
  static constexpr char kHex[] = "0123456789abcdef";
  put('"');
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      put('\\');
      put(ch);
    } else if (c == '\n') {
      raw("\\n");
    } else if (c < 0x20 || c >= 0x7f) {
      // Control and non-ASCII bytes become \u00XX so the output is valid JSON whatever the input.
      raw("\\u00");
      put(kHex[c >> 4]);
      put(kHex[c & 15]);
    } else {
      put(ch);
    }
  }
  put('"');
  return *this;
}

JsonSink& JsonSink::u64(uint64_t value) noexcept {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  while (n > 0) put(digits[--n]);
  return *this;
}

JsonSink& JsonSink::i64(int64_t value) noexcept {
  if (value < 0) {
    put('-');
    return u64(static_cast<uint64_t>(0) - static_cast<uint64_t>(value));
  }
  return u64(static_cast<uint64_t>(value));
}

JsonSink& JsonSink::hex(uint64_t value) noexcept {
  static constexpr char kHex[] = "0123456789abcdef";
  char digits[16];
  int n = 0;
  do {
    digits[n++] = kHex[value & 15];
    value >>= 4;
  } while (value != 0);
  raw("\"0x");
  while (n > 0) put(digits[--n]);
  put('"');
  return *this;
}

JsonSink& JsonSink::key(std::string_view name, bool first) noexcept {
  if (!first) put(',');
  str(name);
  put(':');
  return *this;
}

bool JsonSink::flush() noexcept {
  if (used_ == 0) return ok_;
  if (out_ != nullptr) {
    out_->append(buf_, used_);
  } else if (ok_) {
    size_t done = 0;
    while (done < used_) {
      const ssize_t n = ::write(fd_, buf_ + done, used_ - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok_ = false;
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  used_ = 0;
  return ok_;
}

}  // namespace tessel::fr::internal
