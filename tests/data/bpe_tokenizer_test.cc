// BpeTokenizer against the reference libraries: ids from tiktoken and tokenizers on the committed
// fixtures (tests/data/make_fixtures.py), round trips, special tokens, errors, and a fuzz of
// arbitrary bytes (random, invalid UTF-8, empty) that must never crash and must round-trip.

#include "tessel/data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "tessel/base/error.h"

namespace tessel::data {
namespace {

using nlohmann::json;
const std::string kFixtures = DATA_FIXTURES;

json load_json(const std::string& name) {
  std::ifstream in(kFixtures + "/" + name);
  EXPECT_TRUE(in) << "missing fixture " << name;
  return json::parse(in);
}

const json& reference() {
  static const json r = load_json("reference.json");
  return r;
}

const std::vector<std::string>& samples() {
  static const std::vector<std::string> s =
      load_json("samples.json").get<std::vector<std::string>>();
  return s;
}

std::vector<SpecialToken> tiktoken_specials() {
  std::vector<SpecialToken> out;
  for (const auto& [text, id] : reference()["tiktoken_specials"].items()) {
    out.push_back({text, id.get<uint32_t>()});
  }
  return out;
}

std::string_view pattern_named(const std::string& name) {
  if (name == "gpt2") return kGpt2Pattern;
  if (name == "cl100k") return kCl100kPattern;
  return kLlama3Pattern;
}

BpeTokenizer tiktoken_fixture(const std::string& pattern) {
  return BpeTokenizer::from_tiktoken(kFixtures + "/bpe.tiktoken", pattern_named(pattern),
                                     tiktoken_specials());
}

std::string printable(const std::string& s) { return json(s).dump(); }

class TiktokenReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TiktokenReferenceTest, IdsEqualTiktoken) {
  const auto tok = tiktoken_fixture(GetParam());
  const json& ref = reference()["tiktoken"][GetParam()];
  ASSERT_EQ(ref["encode"].size(), samples().size());
  for (size_t i = 0; i < samples().size(); ++i) {
    const std::string& text = samples()[i];
    EXPECT_EQ(tok.encode(text), ref["encode"][i].get<std::vector<uint32_t>>())
        << "sample " << i << ": " << printable(text);
    EXPECT_EQ(tok.encode_ordinary(text), ref["encode_ordinary"][i].get<std::vector<uint32_t>>())
        << "sample " << i << ": " << printable(text);
    EXPECT_EQ(tok.decode(tok.encode(text)), text) << "sample " << i;
    EXPECT_EQ(tok.decode(tok.encode_ordinary(text)), text) << "sample " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Patterns, TiktokenReferenceTest,
                         ::testing::Values("gpt2", "cl100k", "llama3"),
                         [](const auto& info) { return info.param; });

class HfReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReferenceTest, IdsEqualTokenizers) {
  const auto tok = BpeTokenizer::from_hf_json(kFixtures + "/bpe_" + GetParam() + ".tokenizer.json");
  const json& ref = reference()["hf"][GetParam()];
  ASSERT_EQ(ref.size(), samples().size());
  for (size_t i = 0; i < samples().size(); ++i) {
    const std::string& text = samples()[i];
    EXPECT_EQ(tok.encode(text), ref[i].get<std::vector<uint32_t>>())
        << "sample " << i << ": " << printable(text);
    EXPECT_EQ(tok.decode(tok.encode(text)), text) << "sample " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Files, HfReferenceTest, ::testing::Values("gpt2", "llama3"),
                         [](const auto& info) { return info.param; });

// tokenizers wrote merges as ["a", "b"]; older files (GPT-2's own) write "a b". Both load alike.
TEST(BpeTokenizerTest, HfMergesAsStringsLoadTheSame) {
  std::ifstream in(kFixtures + "/bpe_gpt2.tokenizer.json");
  json doc = json::parse(in);
  for (auto& m : doc["model"]["merges"]) {
    if (m.is_array()) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  }
  const auto tok = BpeTokenizer::from_hf_json_text(doc.dump(), "strings.json");
  const json& ref = reference()["hf"]["gpt2"];
  for (size_t i = 0; i < samples().size(); ++i) {
    EXPECT_EQ(tok.encode(samples()[i]), ref[i].get<std::vector<uint32_t>>()) << "sample " << i;
  }
}

// ByteLevel's add_prefix_space puts a space before every piece of text between added tokens that
// does not start with one.
TEST(BpeTokenizerTest, HfAddPrefixSpace) {
  std::ifstream in(kFixtures + "/bpe_gpt2.tokenizer.json");
  json doc = json::parse(in);
  doc["pre_tokenizer"]["add_prefix_space"] = true;
  const auto tok = BpeTokenizer::from_hf_json_text(doc.dump(), "prefix.json");
  const json& ref = reference()["hf"]["gpt2_prefix_space"];
  ASSERT_EQ(ref.size(), samples().size());
  for (size_t i = 0; i < samples().size(); ++i) {
    EXPECT_EQ(tok.encode(samples()[i]), ref[i].get<std::vector<uint32_t>>())
        << "sample " << i << ": " << printable(samples()[i]);
  }
}

TEST(BpeTokenizerTest, SpecialTokens) {
  const auto tok = tiktoken_fixture("cl100k");
  const uint32_t eot = *tok.special_id("<|endoftext|>");
  EXPECT_EQ(eot, reference()["tiktoken_specials"]["<|endoftext|>"].get<uint32_t>());
  EXPECT_FALSE(tok.special_id("<|nope|>").has_value());
  EXPECT_EQ(tok.encode("<|endoftext|>"), std::vector<uint32_t>{eot});
  const auto ordinary = tok.encode_ordinary("<|endoftext|>");
  EXPECT_GT(ordinary.size(), 1u);
  EXPECT_EQ(tok.decode(ordinary), "<|endoftext|>");
  EXPECT_EQ(tok.decode(std::vector<uint32_t>{eot, eot}), "<|endoftext|><|endoftext|>");
  EXPECT_EQ(tok.vocab_size(), eot + 2);  // <|endoftext|>, then <|pad|>
}

TEST(BpeTokenizerTest, DecodeNamesAnUnknownId) {
  const auto tok = tiktoken_fixture("gpt2");
  const std::vector<uint32_t> ids = {72, 9999999};
  try {
    tok.decode(ids);
    FAIL() << "decode accepted an unknown id";
  } catch (const OutOfRange& e) {
    EXPECT_NE(std::string(e.what()).find("id 9999999 at position 1"), std::string::npos)
        << e.what();
  }
}

TEST(BpeTokenizerTest, BadFilesNameTheFileAndLine) {
  auto expect_error = [](auto&& make, const std::string& needle) {
    try {
      make();
      ADD_FAILURE() << "no error; expected one containing " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(
      [] {
        BpeTokenizer::from_tiktoken_text("AA== 0\nnot base64!! 1\n", kGpt2Pattern, {},
                                         "bad.tiktoken");
      },
      "bad.tiktoken:2: expected \"<base64 token> <rank>\"");
  expect_error(
      [] {
        BpeTokenizer::from_tiktoken_text("AA== 0\nAQ== 0\n", kGpt2Pattern, {}, "dup.tiktoken");
      },
      "dup.tiktoken:2: rank 0 appears twice");
  expect_error(
      [] { BpeTokenizer::from_tiktoken_text("AA== 0\n", kGpt2Pattern, {}, "short.tiktoken"); },
      "short.tiktoken: the vocabulary has no token for the single byte 0x01");
  expect_error([] { BpeTokenizer::from_tiktoken(kFixtures + "/bpe.tiktoken", "(unclosed", {}); },
               "does not compile");
  expect_error([] { BpeTokenizer::from_tiktoken("/nonexistent/x.tiktoken", kGpt2Pattern, {}); },
               "/nonexistent/x.tiktoken");
  expect_error([] { BpeTokenizer::from_hf_json_text("{", "broken.json"); },
               "broken.json: not valid JSON");
  std::ifstream in(kFixtures + "/bpe_gpt2.tokenizer.json");
  json doc = json::parse(in);
  doc["normalizer"] = {{"type", "NFC"}};
  expect_error([&] { BpeTokenizer::from_hf_json_text(doc.dump(), "nfc.json"); },
               "nfc.json: normalizer");
  doc["normalizer"] = nullptr;
  doc["added_tokens"][0]["lstrip"] = true;
  expect_error([&] { BpeTokenizer::from_hf_json_text(doc.dump(), "lstrip.json"); },
               "lstrip.json: added_tokens: \"<|endoftext|>\" has lstrip set");
  doc["added_tokens"][0]["lstrip"] = false;
  doc["model"]["type"] = "WordPiece";
  expect_error([&] { BpeTokenizer::from_hf_json_text(doc.dump(), "wp.json"); },
               "wp.json: model.type");
}

// Random bytes (mostly invalid UTF-8), cuts of valid text mid-character, special tokens'
// fragments, and empty input: every tokenizer returns ids that decode to the same bytes.
TEST(BpeTokenizerTest, FuzzRoundTripsAnyBytes) {
  std::vector<BpeTokenizer> toks;
  for (const char* p : {"gpt2", "cl100k", "llama3"}) toks.push_back(tiktoken_fixture(p));
  toks.push_back(BpeTokenizer::from_hf_json(kFixtures + "/bpe_gpt2.tokenizer.json"));
  toks.push_back(BpeTokenizer::from_hf_json(kFixtures + "/bpe_llama3.tokenizer.json"));
  std::string all_samples;
  for (const auto& s : samples()) all_samples += s;
  std::mt19937_64 rng(20261128);
  const std::vector<std::string> fragments = {
      "<|endoftext|>", "<|end", "oftext|>", "<|pad|>", "'s", "\r\n", "  ",
      "\xF0\x9F",      "\xC3",  "\xFF",     "\x80"};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int kind = iter % 3;
    const size_t len = rng() % 200;
    if (kind == 0) {  // random bytes
      for (size_t i = 0; i < len; ++i) text.push_back(static_cast<char>(rng() & 0xFF));
    } else if (kind == 1) {  // a slice of real text, likely cut inside a character
      const size_t start = rng() % all_samples.size();
      text = all_samples.substr(start, len);
    } else {  // fragments and bytes mixed
      while (text.size() < len) {
        if (rng() % 2)
          text += fragments[rng() % fragments.size()];
        else
          text.push_back(static_cast<char>(rng() & 0xFF));
      }
    }
    if (iter == 0) text.clear();
    for (const auto& tok : toks) {
      ASSERT_EQ(tok.decode(tok.encode(text)), text)
          << "iteration " << iter << ": " << printable(text);
      ASSERT_EQ(tok.decode(tok.encode_ordinary(text)), text) << "iteration " << iter;
    }
  }
}

// Long words take the heap path with many candidates; a repeated word hits the cache.
TEST(BpeTokenizerTest, LongWordsAndCacheAgree) {
  const auto tok = tiktoken_fixture("gpt2");
  std::string word(5000, 'a');
  const auto ids = tok.encode(word);
  EXPECT_EQ(tok.decode(ids), word);
  const auto once = tok.encode("tokenizer");
  EXPECT_EQ(tok.encode("tokenizer"), once);
  std::vector<uint32_t> twice = tok.encode(" tokenizer tokenizer");
  EXPECT_EQ(tok.decode(twice), " tokenizer tokenizer");
}

// Several threads encode at once (each has its own cache) and agree with one thread.
TEST(BpeTokenizerTest, ThreadsAgree) {
  const auto tok = tiktoken_fixture("cl100k");
  std::vector<std::vector<uint32_t>> expected;
  for (const auto& s : samples()) expected.push_back(tok.encode(s));
  std::vector<std::jthread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        for (size_t i = 0; i < samples().size(); ++i) {
          if (tok.encode(samples()[i]) != expected[i]) ++mismatches;
        }
      }
    });
  }
  threads.clear();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace tessel::data
