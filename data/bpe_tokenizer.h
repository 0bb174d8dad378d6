#pragma once
// Byte-level BPE tokenizer: loads a tiktoken ranks file (GPT-2's, cl100k's, Llama 3's encodings)
// or a Hugging Face tokenizer.json with a BPE model, and encodes and decodes exactly as tiktoken
// and tokenizers do (ids equal on the fixtures in tests/data/fixtures; see docs/data.md).
//
//   auto tok = data::BpeTokenizer::from_tiktoken("cl100k_base.tiktoken", data::kCl100kPattern,
//                                                {{"<|endoftext|>", 100257}});
//   std::vector<uint32_t> ids = tok.encode("Hello, world!");
//   std::string text = tok.decode(ids);  // "Hello, world!"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::data {

// Pre-tokenization patterns (PCRE syntax) of the published encodings, as tiktoken writes them.
// GPT-2 (r50k/p50k and Hugging Face's ByteLevel pre-tokenizer):
inline constexpr std::string_view kGpt2Pattern =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";
// cl100k_base (GPT-3.5/4):
inline constexpr std::string_view kCl100kPattern =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";
// Llama 3 (its tokenizer.model and tokenizer.json):
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A token matched literally in the text before pre-tokenization (e.g. "<|endoftext|>").
struct SpecialToken {
  std::string text;
  uint32_t id = 0;
};

// An immutable tokenizer. Thread-safe: encode and decode may run on many threads at once (each
// thread keeps its own cache of encoded words). Movable, not copyable.
class BpeTokenizer {
 public:
  // A tiktoken ranks file: one "<base64 token bytes> <rank>" per line; the rank is the id.
  // `pattern` splits text into words (one of the k*Pattern above, or your own PCRE pattern).
  // Throws IoError if the file cannot be read, InvalidArgument naming the file and line for a
  // malformed line, a duplicate, or a missing single-byte token.
  static BpeTokenizer from_tiktoken(const std::filesystem::path& path, std::string_view pattern,
                                    std::vector<SpecialToken> specials = {});
  // The same from the file's contents (`source` names it in errors).
  static BpeTokenizer from_tiktoken_text(std::string_view contents, std::string_view pattern,
                                         std::vector<SpecialToken> specials,
                                         std::string_view source = "<memory>");

  // A Hugging Face tokenizer.json whose model is BPE over a ByteLevel alphabet (GPT-2,
  // Llama 3 files): vocab, merges (either JSON form), added tokens (matched as
  // special tokens), pre-tokenizer ByteLevel or Sequence[Split(Regex), ByteLevel]. Throws
  // InvalidArgument naming the file and the field for anything else (a normalizer, WordPiece,
  // a non-byte-level model, dropout, added tokens with lstrip/rstrip/single_word). encode() does
  // not add the post-processor's BOS/EOS (tokenizers' add_special_tokens=False).
  static BpeTokenizer from_hf_json(const std::filesystem::path& path);
  static BpeTokenizer from_hf_json_text(std::string_view contents,
                                        std::string_view source = "<memory>");

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // Ids of `text`, special tokens included where their text occurs (tiktoken's
  // allowed_special="all"). Any bytes are accepted: invalid UTF-8 is split off and encoded
  // byte by byte, so decode(encode(b)) == b for every byte string b.
  std::vector<uint32_t> encode(std::string_view text) const;
  // Ids of `text` with special tokens' text encoded as ordinary text (tiktoken's
  // encode_ordinary).
  std::vector<uint32_t> encode_ordinary(std::string_view text) const;
  // The bytes of `ids` concatenated (not necessarily valid UTF-8 when cut mid-character).
  // Throws OutOfRange naming the first id that is not in the vocabulary.
  std::string decode(std::span<const uint32_t> ids) const;

  // One more than the largest id (ordinary or special).
  uint32_t vocab_size() const;
  // The id of a special token, if the tokenizer has it.
  std::optional<uint32_t> special_id(std::string_view text) const;
  // The bytes of one id; throws OutOfRange for an unknown id.
  std::string_view token_bytes(uint32_t id) const;

  struct Impl;

 private:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel::data
