#include "tessel/data/internal/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <memory>

#include "tessel/base/error.h"

namespace tessel::data::internal {

namespace {

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

}  // namespace

Pretokenizer::Pretokenizer(std::string_view pattern, std::string_view source) : pattern_(pattern) {
  // UTF + UCP: \p{L}, \s and (?i) follow Unicode as Rust's regex does; DOLLAR_ENDONLY: `$` is
  // the end of the text only (PCRE's default also matches before a final newline);
  // MATCH_INVALID_UTF: invalid UTF-8 is never matched instead of failing the whole search.
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_MATCH_INVALID_UTF, &error,
                    &error_offset, nullptr);
  if (code == nullptr) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error, message.data(), message.size());
    throw InvalidArgument(
        fmt::format("{}: pre-tokenization pattern does not compile at offset {}: {}", source,
                    error_offset, reinterpret_cast<const char*>(message.data())));
  }
  // The JIT is an optimisation: where it is unavailable, pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Pretokenizer::~Pretokenizer() { pcre2_code_free(as_code(code_)); }

void Pretokenizer::split(std::string_view text,
                         std::vector<std::pair<size_t, size_t>>& words) const {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data(
      pcre2_match_data_create(4, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t covered = 0;  // words cover [0, covered)
  size_t offset = 0;   // where the next search starts
  while (offset < text.size()) {
    const int rc =
        pcre2_match(as_code(code_), subject, text.size(), offset, 0, match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    TESSEL_CHECK(rc >= 0, Internal, "pre-tokenization match failed with PCRE2 error {} at byte {}",
                 rc, offset);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_data.get());
    const size_t begin = ov[0];
    const size_t end = ov[1];
    if (end == begin) {  // an empty match (no published pattern has one): skip a byte
      offset = begin + 1;
      continue;
    }
    if (begin > covered) words.emplace_back(covered, begin);
    words.emplace_back(begin, end);
    covered = offset = end;
  }
  if (covered < text.size()) words.emplace_back(covered, text.size());
}

namespace {

// bytes_to_unicode(): printable Latin-1 bytes stand for themselves; the others, in byte order,
// for U+0100 onwards.
struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<int, 512> code_to_byte;  // code point -> byte, -1 if none

  ByteLevelTables() {
    code_to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int code = printable ? b : next++;
      code_to_byte[code] = b;
      std::string& s = chars[b];
      if (code < 0x80) {
        s.push_back(static_cast<char>(code));
      } else {
        s.push_back(static_cast<char>(0xC0 | (code >> 6)));
        s.push_back(static_cast<char>(0x80 | (code & 0x3F)));
      }
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

const std::string& byte_level_char(unsigned char byte) { return tables().chars[byte]; }

bool byte_level_decode(std::string_view chars, std::string& out) {
  const auto& t = tables();
  for (size_t i = 0; i < chars.size();) {
    const auto c0 = static_cast<unsigned char>(chars[i]);
    int code = -1;
    if (c0 < 0x80) {
      code = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < chars.size()) {
      code = ((c0 & 0x1F) << 6) | (static_cast<unsigned char>(chars[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;
    }
    if (code >= static_cast<int>(t.code_to_byte.size()) || t.code_to_byte[code] < 0) return false;
    out.push_back(static_cast<char>(t.code_to_byte[code]));
  }
  return true;
}

}  // namespace tessel::data::internal
