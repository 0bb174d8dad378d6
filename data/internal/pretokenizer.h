#pragma once
// Splits text into the words BPE merges within, with a PCRE2 pattern (JIT-compiled), the way
// tiktoken and tokenizers' Split(Isolated) do: every match is a word and so is every gap between
// matches, so the words always cover the text.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessel::data::internal {

// Immutable after construction; split() is thread-safe.
class Pretokenizer {
 public:
  // Throws InvalidArgument with PCRE2's message and the offset for a pattern that does not
  // compile. `source` names the pattern's origin in errors.
  Pretokenizer(std::string_view pattern, std::string_view source);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Appends the [begin, end) byte ranges of the words of `text`, in order, covering it.
  // Text that is not valid UTF-8 never matches; its bytes become gap words.
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& words) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

// GPT-2's bytes_to_unicode: the printable character that stands for each byte in byte-level
// BPE vocabularies (tokenizer.json), as UTF-8.
const std::string& byte_level_char(unsigned char byte);
// The inverse: appends the bytes a byte-level string stands for; false if it has a character
// outside the 256.
bool byte_level_decode(std::string_view chars, std::string& out);

}  // namespace tessel::data::internal
