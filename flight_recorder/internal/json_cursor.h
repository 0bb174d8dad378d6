#pragma once
// A streaming JSON reader for dumps: walks the text once, handing each object key and array
// item to the caller, who reads the value in place (no document tree, no allocation for keys or
// numbers). A thousand ranks' full rings are gigabytes of JSON; this reads them at the speed of
// the text. Errors name the value's path ("entries[3].seq") and say what was expected and
// found; malformed text throws JsonCursor::SyntaxError with the byte offset.
//
// Not thread-safe; one cursor per text.

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessel::fr::internal {

class JsonCursor {
 public:
  struct SyntaxError {
    size_t offset;
    std::string what;
  };
  // A value of the wrong type: `found` is its JSON type name.
  struct TypeError {
    std::string expected, found;
  };

  explicit JsonCursor(std::string_view text) : t_(text) {}

  // Calls on_key(key) for each member of the object at the cursor; on_key reads the value.
  template <typename OnKey>
  void object(OnKey&& on_key) {
    expect_type('{', "an object");
    ++p_;
    ws();
    if (peek() == '}') {
      ++p_;
      return;
    }
    for (;;) {
      ws();
      if (peek() != '"') syntax("expected a member name");
      const std::string_view key = raw_string();
      ws();
      if (peek() != ':') syntax("expected ':'");
      ++p_;
      ws();
      on_key(key);
      ws();
      const char c = peek();
      ++p_;
      if (c == '}') return;
      if (c != ',') syntax("expected ',' or '}'");
    }
  }

  // Calls on_item(index) for each element of the array at the cursor.
  template <typename OnItem>
  void array(OnItem&& on_item) {
    expect_type('[', "an array");
    ++p_;
    ws();
    if (peek() == ']') {
      ++p_;
      return;
    }
    for (size_t i = 0;; ++i) {
      ws();
      on_item(i);
      ws();
      const char c = peek();
      ++p_;
      if (c == ']') return;
      if (c != ',') syntax("expected ',' or ']'");
    }
  }

  int64_t integer() {
    const char c = peek();
    if (c != '-' && (c < '0' || c > '9')) throw TypeError{"an integer", type_at()};
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(t_.data() + p_, t_.data() + t_.size(), v);
    if (ec != std::errc()) syntax("integer out of range");
    p_ = static_cast<size_t>(end - t_.data());
    if (p_ < t_.size() && (t_[p_] == '.' || t_[p_] == 'e' || t_[p_] == 'E')) {
      throw TypeError{"an integer", "number"};
    }
    return v;
  }
  uint64_t unsigned_integer() {
    if (peek() == '-') throw TypeError{"an unsigned integer", "negative number"};
    uint64_t v = 0;
    const char c = peek();
    if (c < '0' || c > '9') throw TypeError{"an unsigned integer", type_at()};
    const auto [end, ec] = std::from_chars(t_.data() + p_, t_.data() + t_.size(), v);
    if (ec != std::errc()) syntax("integer out of range");
    p_ = static_cast<size_t>(end - t_.data());
    return v;
  }
  bool boolean() {
    if (t_.substr(p_, 4) == "true") {
      p_ += 4;
      return true;
    }
    if (t_.substr(p_, 5) == "false") {
      p_ += 5;
      return false;
    }
    throw TypeError{"true or false", type_at()};
  }
  std::string string() {
    expect_type('"', "a string");
    const std::string_view raw = raw_string();
    if (raw.find('\\') == std::string_view::npos) return std::string(raw);
    return unescape(raw);
  }
  // Skips the value at the cursor, whatever it is.
  void skip() {
    const char c = peek();
    if (c == '{') {
      object([&](std::string_view) { skip(); });
    } else if (c == '[') {
      array([&](size_t) { skip(); });
    } else if (c == '"') {
      raw_string();
    } else {
      while (p_ < t_.size() && t_[p_] != ',' && t_[p_] != '}' && t_[p_] != ']' && t_[p_] != ' ' &&
             t_[p_] != '\n') {
        ++p_;
      }
    }
  }
  // After the top-level value: only whitespace may follow.
  void finish() {
    ws();
    if (p_ != t_.size()) syntax("unexpected text after the end");
  }
  size_t offset() const { return p_; }
  // The JSON type of the value at the cursor: "object", "array", "string", "number", ...
  std::string type_at() const {
    switch (p_ < t_.size() ? t_[p_] : '\0') {
      case '{':
        return "object";
      case '[':
        return "array";
      case '"':
        return "string";
      case 't':
      case 'f':
        return "boolean";
      case 'n':
        return "null";
      default:
        return "number";
    }
  }

 private:
  [[noreturn]] void syntax(const char* what) const { throw SyntaxError{p_, what}; }
  char peek() const {
    if (p_ >= t_.size()) syntax("unexpected end of text");
    return t_[p_];
  }
  void ws() {
    while (p_ < t_.size() &&
           (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\r' || t_[p_] == '\t')) {
      ++p_;
    }
  }
  void expect_type(char open, const char* expected) {
    if (peek() != open) throw TypeError{expected, type_at()};
  }
  // The characters between the quotes, escapes left as they are.
  std::string_view raw_string() {
    const size_t start = ++p_;
    const char* s = t_.data();
    const size_t n = t_.size();
    size_t q = p_;
    for (;;) {
      while (q < n && s[q] != '"' && s[q] != '\\') ++q;
      if (q >= n) {
        p_ = n;
        syntax("unterminated string");
      }
      if (s[q] == '"') {
        p_ = q + 1;
        return t_.substr(start, q - start);
      }
      q += 2;
    }
  }
  std::string unescape(std::string_view raw) const {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '\\' || i + 1 >= raw.size()) {
        out += raw[i];
        continue;
      }
      const char e = raw[++i];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          unsigned code = 0;
          if (i + 4 < raw.size()) {
            std::from_chars(raw.data() + i + 1, raw.data() + i + 5, code, 16);
            i += 4;
          }
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xc0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3f));
          } else {
            out += static_cast<char>(0xe0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (code & 0x3f));
          }
          break;
        }
        default:
          out += e;
      }
    }
    return out;
  }

  std::string_view t_;
  size_t p_ = 0;
};

}  // namespace tessel::fr::internal
