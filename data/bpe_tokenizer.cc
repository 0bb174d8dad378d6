#include "tessel/data/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "tessel/base/error.h"
#include "tessel/data/internal/pretokenizer.h"

namespace tessel::data {

namespace {

// Hugging Face's ByteLevel pre-tokenizer pattern (use_regex=true); splits as kGpt2Pattern does.
constexpr std::string_view kHfByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Words up to this many bytes are cached per thread; the cache is dropped when it holds
// kCacheEntries words (a simple bound: natural text's common words come back within a chunk).
constexpr size_t kCacheWordBytes = 64;
constexpr size_t kCacheEntries = 1 << 16;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using BytesToId = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_system_error(fmt::format("cannot open tokenizer file {}", path.string()), errno);
  std::ostringstream contents;
  contents << in.rdbuf();
  TESSEL_CHECK(in.good() || in.eof(), IoError, "cannot read tokenizer file {}", path.string());
  return contents.str();
}

// Standard base64 (with padding), as tiktoken files use; nullopt for anything else.
std::optional<std::string> base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (in.empty() || in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else {
        if (pad > 0) return std::nullopt;  // data after padding
        v[k] = value(c);
        if (v[k] < 0) return std::nullopt;
      }
    }
    const uint32_t triple = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>(triple >> 16));
    if (pad < 2) out.push_back(static_cast<char>((triple >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(triple & 0xFF));
  }
  return out;
}

std::atomic<uint64_t> next_uid{1};

}  // namespace

struct BpeTokenizer::Impl {
  enum class Mode { kTiktoken, kHuggingFace };
  Mode mode = Mode::kTiktoken;
  std::unique_ptr<internal::Pretokenizer> pretokenizer;
  bool add_prefix_space = false;  // Hugging Face ByteLevel's option
  // A word that is itself a token becomes that token without merging: always in tiktoken,
  // with ignore_merges in tokenizers.
  bool whole_word_lookup = true;
  BytesToId bytes_to_id;  // tiktoken: bytes -> rank (= id); HF: vocab bytes -> id
  // HF: (left id << 32 | right id) -> (merge rank, merged id).
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges;
  std::array<uint32_t, 256> byte_id{};
  std::vector<std::string> id_bytes;
  std::vector<bool> id_known;
  std::vector<SpecialToken> specials;  // longest first
  std::array<bool, 256> special_first{};
  uint64_t uid = next_uid.fetch_add(1);

  void set_token(uint32_t id, std::string bytes) {
    if (id >= id_bytes.size()) {
      id_bytes.resize(id + 1);
      id_known.resize(id + 1, false);
    }
    id_bytes[id] = std::move(bytes);
    id_known[id] = true;
  }

  void set_specials(std::vector<SpecialToken> list, std::string_view source) {
    for (auto& s : list) {
      TESSEL_CHECK(!s.text.empty(), InvalidArgument, "{}: special token {} has empty text", source,
                   s.id);
      set_token(s.id, s.text);
    }
    std::stable_sort(list.begin(), list.end(), [](const SpecialToken& a, const SpecialToken& b) {
      return a.text.size() > b.text.size();
    });
    specials = std::move(list);
    special_first.fill(false);
    for (const auto& s : specials) special_first[static_cast<unsigned char>(s.text[0])] = true;
  }

  // The first special token at or after `pos`: (offset, index in specials), or (npos, 0).
  std::pair<size_t, size_t> find_special(std::string_view text, size_t pos) const {
    for (size_t i = pos; i < text.size(); ++i) {
      if (!special_first[static_cast<unsigned char>(text[i])]) continue;
      for (size_t k = 0; k < specials.size(); ++k) {
        if (text.substr(i).starts_with(specials[k].text)) return {i, k};
      }
    }
    return {std::string_view::npos, 0};
  }

  // Merges one word: repeatedly the adjacent pair of lowest rank, leftmost first, as both
  // reference libraries do. Parts form a linked list; candidate pairs sit in a min-heap and are
  // checked on the way out (a pair whose parts have since grown is stale).
  void merge_word(std::string_view word, std::vector<uint32_t>& out) const {
    const size_t n = word.size();
    if (n == 1) {
      out.push_back(byte_id[static_cast<unsigned char>(word[0])]);
      return;
    }
    if (whole_word_lookup) {
      if (auto it = bytes_to_id.find(word); it != bytes_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    struct Part {
      uint32_t len;
      uint32_t id;
      int32_t prev;
      int32_t next;
    };
    struct Candidate {
      uint32_t rank;
      uint32_t left;  // the left part's start (= its index)
      uint32_t left_len;
      uint32_t right_len;
      uint32_t merged_id;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    thread_local std::vector<Part> parts;
    thread_local std::vector<Candidate> heap;
    parts.resize(n);
    heap.clear();
    for (size_t i = 0; i < n; ++i) {
      parts[i] = {1, byte_id[static_cast<unsigned char>(word[i])], static_cast<int32_t>(i) - 1,
                  i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
    }
    auto consider = [&](int32_t left) {
      if (left < 0) return;
      const int32_t right = parts[left].next;
      if (right < 0) return;
      const Part& l = parts[left];
      const Part& r = parts[right];
      uint32_t rank = 0;
      uint32_t merged = 0;
      if (mode == Mode::kTiktoken) {
        auto it = bytes_to_id.find(word.substr(left, l.len + r.len));
        if (it == bytes_to_id.end()) return;
        rank = merged = it->second;
      } else {
        auto it = merges.find(static_cast<uint64_t>(l.id) << 32 | r.id);
        if (it == merges.end()) return;
        std::tie(rank, merged) = it->second;
      }
      heap.push_back({rank, static_cast<uint32_t>(left), l.len, r.len, merged});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    };
    for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
      const Candidate c = heap.back();
      heap.pop_back();
      Part& l = parts[c.left];
      if (l.len != c.left_len || l.next < 0) continue;  // merged away or grown since
      Part& r = parts[l.next];
      if (r.len != c.right_len) continue;
      l.len += r.len;
      l.id = c.merged_id;
      r.len = 0;
      l.next = r.next;
      if (l.next >= 0) parts[l.next].prev = static_cast<int32_t>(c.left);
      consider(l.prev);
      consider(static_cast<int32_t>(c.left));
    }
    for (int32_t i = 0; i >= 0; i = parts[i].next) out.push_back(parts[i].id);
  }

  void encode_segment(std::string_view segment, std::vector<uint32_t>& out) const {
    if (segment.empty()) return;
    std::string prefixed;
    if (add_prefix_space && segment[0] != ' ') {
      prefixed = " " + std::string(segment);
      segment = prefixed;
    }
    struct Cache {
      uint64_t owner = 0;
      std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> words;
    };
    thread_local Cache cache;
    thread_local std::vector<std::pair<size_t, size_t>> words;
    if (cache.owner != uid) {
      cache.words.clear();
      cache.owner = uid;
    }
    words.clear();
    pretokenizer->split(segment, words);
    for (const auto& [begin, end] : words) {
      const std::string_view word = segment.substr(begin, end - begin);
      if (word.size() > kCacheWordBytes) {
        merge_word(word, out);
        continue;
      }
      if (auto it = cache.words.find(word); it != cache.words.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
      const size_t first = out.size();
      merge_word(word, out);
      if (cache.words.size() >= kCacheEntries) cache.words.clear();
      cache.words.emplace(std::string(word), std::vector<uint32_t>(out.begin() + first, out.end()));
    }
  }

  std::vector<uint32_t> encode(std::string_view text, bool with_specials) const {
    std::vector<uint32_t> out;
    out.reserve(text.size() / 3 + 1);
    size_t pos = 0;
    while (pos <= text.size()) {
      auto [at, k] = with_specials && !specials.empty()
                         ? find_special(text, pos)
                         : std::pair{std::string_view::npos, size_t{0}};
      const size_t end = at == std::string_view::npos ? text.size() : at;
      encode_segment(text.substr(pos, end - pos), out);
      if (at == std::string_view::npos) break;
      out.push_back(specials[k].id);
      pos = at + specials[k].text.size();
    }
    return out;
  }

  void check_bytes_complete(std::string_view source) {
    for (int b = 0; b < 256; ++b) {
      std::string one(1, static_cast<char>(b));
      auto it = bytes_to_id.find(one);
      TESSEL_CHECK(it != bytes_to_id.end(), InvalidArgument,
                   "{}: the vocabulary has no token for the single byte 0x{:02x}; byte-level BPE "
                   "needs all 256",
                   source, b);
      byte_id[b] = it->second;
    }
  }
};

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::from_tiktoken(const std::filesystem::path& path,
                                         std::string_view pattern,
                                         std::vector<SpecialToken> specials) {
  return from_tiktoken_text(read_file(path), pattern, std::move(specials), path.string());
}

BpeTokenizer BpeTokenizer::from_tiktoken_text(std::string_view contents, std::string_view pattern,
                                              std::vector<SpecialToken> specials,
                                              std::string_view source) {
  auto impl = std::make_unique<Impl>();
  impl->mode = Impl::Mode::kTiktoken;
  impl->pretokenizer = std::make_unique<internal::Pretokenizer>(pattern, source);
  size_t line_number = 0;
  for (size_t pos = 0; pos < contents.size();) {
    size_t eol = contents.find('\n', pos);
    if (eol == std::string_view::npos) eol = contents.size();
    std::string_view line = contents.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    uint32_t rank = 0;
    const std::string_view rank_text =
        space == std::string_view::npos ? std::string_view{} : line.substr(space + 1);
    const auto [end, ec] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    std::optional<std::string> bytes =
        space == std::string_view::npos ? std::nullopt : base64_decode(line.substr(0, space));
    TESSEL_CHECK(bytes && ec == std::errc() && end == rank_text.data() + rank_text.size() &&
                     !rank_text.empty(),
                 InvalidArgument, "{}:{}: expected \"<base64 token> <rank>\", got \"{}\"", source,
                 line_number, line.substr(0, 80));
    TESSEL_CHECK(rank < (1u << 31), InvalidArgument, "{}:{}: rank {} is too large", source,
                 line_number, rank);
    TESSEL_CHECK(rank >= impl->id_known.size() || !impl->id_known[rank], InvalidArgument,
                 "{}:{}: rank {} appears twice", source, line_number, rank);
    const bool inserted = impl->bytes_to_id.emplace(*bytes, rank).second;
    TESSEL_CHECK(inserted, InvalidArgument, "{}:{}: token \"{}\" appears twice", source,
                 line_number, line.substr(0, space));
    impl->set_token(rank, std::move(*bytes));
  }
  impl->check_bytes_complete(source);
  for (const auto& s : specials) {
    TESSEL_CHECK(s.id >= impl->id_known.size() || !impl->id_known[s.id], InvalidArgument,
                 "{}: special token \"{}\" has id {}, which an ordinary token already has", source,
                 s.text, s.id);
  }
  impl->set_specials(std::move(specials), source);
  return BpeTokenizer(std::move(impl));
}

BpeTokenizer BpeTokenizer::from_hf_json(const std::filesystem::path& path) {
  return from_hf_json_text(read_file(path), path.string());
}

BpeTokenizer BpeTokenizer::from_hf_json_text(std::string_view contents, std::string_view source) {
  using nlohmann::json;
  json doc;
  try {
    doc = json::parse(contents);
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  auto fail = [&](std::string_view field, std::string_view what) -> InvalidArgument {
    return InvalidArgument(fmt::format("{}: {}: {}", source, field, what));
  };
  auto null_or_empty = [](const json& j, const char* key) {
    return !j.contains(key) || j[key].is_null() ||
           (j[key].is_string() && j[key].get<std::string>().empty());
  };
  try {
    auto impl = std::make_unique<Impl>();
    impl->mode = Impl::Mode::kHuggingFace;
    if (doc.contains("normalizer") && !doc["normalizer"].is_null()) {
      throw fail("normalizer", "only null is supported (byte-level BPE files have none), got " +
                                   doc["normalizer"].dump().substr(0, 80));
    }
    const json& model = doc.at("model");
    if (model.contains("type") && model["type"] != "BPE") {
      throw fail("model.type", "expected \"BPE\", got " + model["type"].dump());
    }
    if (!null_or_empty(model, "dropout")) throw fail("model.dropout", "must be null");
    if (!null_or_empty(model, "continuing_subword_prefix") ||
        !null_or_empty(model, "end_of_word_suffix")) {
      throw fail("model", "continuing_subword_prefix / end_of_word_suffix are not byte-level BPE");
    }
    if (model.value("byte_fallback", false)) throw fail("model.byte_fallback", "must be false");
    impl->whole_word_lookup = model.value("ignore_merges", false);

    // Pre-tokenizer: ByteLevel (with its own regex) or Split(Regex) then ByteLevel(no regex).
    const json& pre = doc.at("pre_tokenizer");
    std::string pattern;
    auto byte_level = [&](const json& p, bool alone) {
      impl->add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) {
        if (!alone) throw fail("pre_tokenizer", "ByteLevel with use_regex after a Split");
        pattern = kHfByteLevelPattern;
      }
    };
    if (pre.is_object() && pre.value("type", "") == "ByteLevel") {
      byte_level(pre, true);
    } else if (pre.is_object() && pre.value("type", "") == "Sequence" &&
               pre.at("pretokenizers").size() == 2 &&
               pre["pretokenizers"][0].value("type", "") == "Split" &&
               pre["pretokenizers"][1].value("type", "") == "ByteLevel") {
      const json& split = pre["pretokenizers"][0];
      if (!split.at("pattern").contains("Regex") || split.value("behavior", "") != "Isolated" ||
          split.value("invert", false)) {
        throw fail("pre_tokenizer.pretokenizers[0]",
                   "expected Split with a Regex pattern, behavior Isolated, invert false");
      }
      pattern = split["pattern"]["Regex"].get<std::string>();
      byte_level(pre["pretokenizers"][1], false);
    } else {
      throw fail("pre_tokenizer", "expected ByteLevel or Sequence[Split(Regex), ByteLevel], got " +
                                      pre.dump().substr(0, 120));
    }
    impl->pretokenizer =
        std::make_unique<internal::Pretokenizer>(pattern, fmt::format("{}: pre_tokenizer", source));

    // Vocabulary: byte-level strings -> ids.
    std::unordered_map<std::string, uint32_t> vocab;  // byte-level string -> id
    for (const auto& [key, value] : model.at("vocab").items()) {
      std::string bytes;
      if (!internal::byte_level_decode(key, bytes)) {
        throw fail("model.vocab", "token \"" + key + "\" is not a byte-level string");
      }
      const auto id = value.get<uint32_t>();
      vocab.emplace(key, id);
      impl->bytes_to_id.emplace(bytes, id);
      impl->set_token(id, std::move(bytes));
    }
    impl->check_bytes_complete(source);

    // Merges, in rank order: "a b" or ["a", "b"].
    uint32_t rank = 0;
    for (const auto& m : model.at("merges")) {
      std::string a, b;
      if (m.is_string()) {
        const auto s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos) throw fail("model.merges", "\"" + s + "\" has no space");
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else {
        a = m.at(0).get<std::string>();
        b = m.at(1).get<std::string>();
      }
      auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
      if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end()) {
        throw fail("model.merges", fmt::format("merge {} (\"{}\" + \"{}\") names a token not in "
                                               "the vocabulary",
                                               rank, a, b));
      }
      impl->merges.try_emplace(static_cast<uint64_t>(ia->second) << 32 | ib->second, rank,
                               iab->second);
      ++rank;
    }

    std::vector<SpecialToken> specials;
    if (doc.contains("added_tokens")) {
      for (const auto& t : doc["added_tokens"]) {
        const auto content = t.at("content").get<std::string>();
        // Matching with stripped neighbours or on word boundaries would change the ids.
        for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
          if (t.value(flag, false)) {
            throw fail("added_tokens",
                       fmt::format("\"{}\" has {} set, which is not supported", content, flag));
          }
        }
        specials.push_back({content, t.at("id").get<uint32_t>()});
      }
    }
    impl->set_specials(std::move(specials), source);
    return BpeTokenizer(std::move(impl));
  } catch (const json::exception& e) {
    throw InvalidArgument(
        fmt::format("{}: not a Hugging Face BPE tokenizer.json: {}", source, e.what()));
  }
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text) const {
  return impl_->encode(text, true);
}

std::vector<uint32_t> BpeTokenizer::encode_ordinary(std::string_view text) const {
  return impl_->encode(text, false);
}

std::string_view BpeTokenizer::token_bytes(uint32_t id) const {
  TESSEL_CHECK(id < impl_->id_known.size() && impl_->id_known[id], OutOfRange,
               "token id {} is not in the vocabulary (size {})", id, impl_->id_bytes.size());
  return impl_->id_bytes[id];
}

std::string BpeTokenizer::decode(std::span<const uint32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    TESSEL_CHECK(id < impl_->id_known.size() && impl_->id_known[id], OutOfRange,
                 "decode: id {} at position {} is not in the vocabulary (size {})", id, i,
                 impl_->id_bytes.size());
    out += impl_->id_bytes[id];
  }
  return out;
}

uint32_t BpeTokenizer::vocab_size() const { return static_cast<uint32_t>(impl_->id_bytes.size()); }

std::optional<uint32_t> BpeTokenizer::special_id(std::string_view text) const {
  for (const auto& s : impl_->specials) {
    if (s.text == text) return s.id;
  }
  return std::nullopt;
}

}  // namespace tessel::data
