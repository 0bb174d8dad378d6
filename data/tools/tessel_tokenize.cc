// tessel-tokenize: tokenizes text files into token shards (docs/data.md), in parallel over
// files and over chunks of each file, with a progress line on stderr.
//
//   tessel-tokenize --tiktoken cl100k_base.tiktoken --pattern cl100k
//       --special '<|endoftext|>=100257' --doc-separator '<|endoftext|>' --out shards/ a.txt b.txt
//   tessel-tokenize --hf-json tokenizer.json --out shards/ --format llmc corpus/*.txt
//
// Every file is one document; --doc-separator puts that special token before each one (as
// llm.c's scripts put <|endoftext|> before every document). Shards are named
// OUT/PREFIX_000000.bin, ... and hold --shard-tokens tokens each (the last one fewer); the
// tokens are the same whatever --threads and --chunk-bytes are.
//
// Exit status: 0 done; 1 an input, tokenizer or output error; 64/65 a bad command line.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/base/tools/cli.h"
#include "tessel/data/bpe_tokenizer.h"
#include "tessel/data/token_shard.h"

namespace {

using namespace tessel;
using namespace tessel::data;
namespace fs = std::filesystem;

// One piece of work: bytes [begin, end) of a file's text.
struct Chunk {
  std::shared_ptr<const std::string> text;
  size_t begin = 0;
  size_t end = 0;
  bool document_start = false;
  std::vector<uint32_t> tokens;
};

// Cut points inside a text where every published pattern (GPT-2, cl100k, Llama 3) ends a word:
// after a "\n" that follows a printable ASCII character and precedes an ASCII letter. Encoding
// the pieces one by one then gives the ids of the whole (tessel-tokenize's test checks it).
std::vector<std::pair<size_t, size_t>> chunk_text(const std::string& text, size_t chunk_bytes) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  while (chunk_bytes > 0 && text.size() - begin > chunk_bytes) {
    size_t cut = std::string::npos;
    for (size_t i = begin + chunk_bytes; i + 1 < text.size(); ++i) {
      const unsigned char before = text[i - 1], next = text[i + 1];
      if (text[i] == '\n' && before >= 0x21 && before <= 0x7E &&
          ((next | 0x20) >= 'a' && (next | 0x20) <= 'z')) {
        cut = i + 1;
        break;
      }
    }
    if (cut == std::string::npos) break;
    out.emplace_back(begin, cut);
    begin = cut;
  }
  out.emplace_back(begin, text.size());
  return out;
}

std::shared_ptr<const std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_system_error(fmt::format("cannot open {}", path.string()), errno);
  std::ostringstream contents;
  contents << in.rdbuf();
  return std::make_shared<const std::string>(contents.str());
}

// Accumulates tokens and writes full shards as they fill.
class ShardSink {
 public:
  ShardSink(fs::path dir, std::string prefix, size_t shard_tokens, ShardWriteOptions options)
      : dir_(std::move(dir)),
        prefix_(std::move(prefix)),
        shard_tokens_(shard_tokens),
        options_(options) {}

  void append(const std::vector<uint32_t>& tokens) {
    pending_.insert(pending_.end(), tokens.begin(), tokens.end());
    while (pending_.size() >= shard_tokens_) {
      write(std::span<const uint32_t>(pending_).first(shard_tokens_));
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(shard_tokens_));
    }
  }
  void finish() {
    if (!pending_.empty()) write(pending_);
    pending_.clear();
  }
  size_t shards() const { return shards_; }
  size_t tokens() const { return tokens_; }

 private:
  void write(std::span<const uint32_t> tokens) {
    write_token_shard(dir_ / fmt::format("{}_{:06d}.bin", prefix_, shards_), tokens, options_);
    ++shards_;
    tokens_ += tokens.size();
  }

  fs::path dir_;
  std::string prefix_;
  size_t shard_tokens_;
  ShardWriteOptions options_;
  std::vector<uint32_t> pending_;
  size_t shards_ = 0;
  size_t tokens_ = 0;
};

// The progress line: rewritten in place on a terminal, printed once at the end otherwise.
class Progress {
 public:
  Progress(size_t files) : files_(files), tty_(::isatty(2)), start_(Clock::now()) {}
  void add(size_t bytes, size_t tokens) {
    bytes_ += bytes;
    tokens_ += tokens;
    print(false);
  }
  void file_done() { ++files_done_; }
  void finish(size_t shards) {
    shards_ = shards;
    print(true);
  }

 private:
  using Clock = std::chrono::steady_clock;
  void print(bool last) {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    if (!last && (!tty_ || now - last_print_ < std::chrono::milliseconds(200))) return;
    last_print_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "%stessel-tokenize: %zu/%zu files, %.1f MB, %zu tokens, %.1f MB/s%s%s",
                 tty_ ? "\r" : "", files_done_.load(), files_, bytes_.load() / 1e6, tokens_.load(),
                 secs > 0 ? bytes_.load() / 1e6 / secs : 0.0,
                 last ? fmt::format(", {} shards", shards_).c_str() : "", last ? "\n" : "");
    std::fflush(stderr);
  }

  size_t files_;
  bool tty_;
  Clock::time_point start_;
  Clock::time_point last_print_{};
  std::atomic<size_t> files_done_{0}, bytes_{0}, tokens_{0};
  size_t shards_ = 0;
  std::mutex mu_;
};

// Encodes `chunks` on `threads` threads (each takes the next chunk in turn).
void encode_all(const BpeTokenizer& tok, std::vector<Chunk>& chunks, int threads,
                std::optional<uint32_t> separator, Progress& progress) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < chunks.size();) {
      Chunk& c = chunks[i];
      try {
        if (c.document_start && separator) c.tokens.push_back(*separator);
        const auto ids = tok.encode(std::string_view(*c.text).substr(c.begin, c.end - c.begin));
        c.tokens.insert(c.tokens.end(), ids.begin(), ids.end());
        progress.add(c.end - c.begin, c.tokens.size());
      } catch (...) {
        std::lock_guard lock(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::jthread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  pool.clear();  // joins
  if (error) std::rethrow_exception(error);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessel-tokenize: tokenizes text files into token shards (docs/data.md)"};
  cli::show_defaults(app);
  std::string tiktoken_path, hf_path, pattern = "cl100k", out_dir, prefix = "shard",
                                      format = "tessel", doc_separator;
  std::vector<std::string> specials_text, inputs;
  int64_t shard_tokens = 100'000'000, token_bytes = 0, chunk_bytes = 1 << 20;
  int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  auto* tk = app.add_option("--tiktoken", tiktoken_path, "a tiktoken ranks file");
  auto* hf = app.add_option("--hf-json", hf_path, "a Hugging Face tokenizer.json (BPE)");
  tk->excludes(hf);
  app.add_option("--pattern", pattern,
                 "with --tiktoken: gpt2, cl100k, llama3, or a PCRE pre-tokenization pattern");
  app.add_option("--special", specials_text, "with --tiktoken: a special token TEXT=ID (repeat)");
  app.add_option("--doc-separator", doc_separator,
                 "a special token put before every document (file), e.g. <|endoftext|>");
  app.add_option("--out", out_dir, "the folder for the shards (made if missing)")->required();
  app.add_option("--prefix", prefix, "shard file names: PREFIX_000000.bin, ...");
  app.add_option("--shard-tokens", shard_tokens, "tokens per shard")
      ->check(cli::integer_at_least(1));
  app.add_option("--token-bytes", token_bytes, "2 or 4; 0 picks 2 when the vocabulary fits")
      ->check(cli::one_of({"0", "2", "4"}));
  app.add_option("--format", format, "tessel or llmc (llm.c's .bin header)")
      ->check(cli::one_of({"tessel", "llmc"}));
  app.add_option("--threads", threads, "encoding threads")->check(cli::integer_in(1, 1024));
  app.add_option("--chunk-bytes", chunk_bytes,
                 "split files into chunks of about this many bytes (0: one chunk per file)")
      ->check(cli::integer_at_least(0));
  app.add_option("inputs", inputs, "text files, one document each")->required();
  cli::describe_options(app);
  if (auto status = cli::parse(app, argc, argv, "tessel-tokenize")) return *status;

  try {
    TESSEL_CHECK(!tiktoken_path.empty() || !hf_path.empty(), InvalidArgument,
                 "give a tokenizer: --tiktoken FILE or --hf-json FILE");
    std::optional<BpeTokenizer> tok;
    if (!hf_path.empty()) {
      tok.emplace(BpeTokenizer::from_hf_json(hf_path));
    } else {
      std::vector<SpecialToken> specials;
      for (const auto& s : specials_text) {
        const size_t eq = s.rfind('=');
        uint32_t id = 0;
        TESSEL_CHECK(
            eq != std::string::npos && eq > 0 &&
                std::from_chars(s.data() + eq + 1, s.data() + s.size(), id).ec == std::errc(),
            InvalidArgument, "--special {}: expected TEXT=ID", s);
        specials.push_back({s.substr(0, eq), id});
      }
      const std::string regex = pattern == "gpt2"     ? std::string(kGpt2Pattern)
                                : pattern == "cl100k" ? std::string(kCl100kPattern)
                                : pattern == "llama3" ? std::string(kLlama3Pattern)
                                                      : pattern;
      tok.emplace(BpeTokenizer::from_tiktoken(tiktoken_path, regex, std::move(specials)));
    }
    std::optional<uint32_t> separator;
    if (!doc_separator.empty()) {
      separator = tok->special_id(doc_separator);
      TESSEL_CHECK(separator.has_value(), InvalidArgument,
                   "--doc-separator {}: the tokenizer has no such special token", doc_separator);
    }
    ShardWriteOptions options;
    options.vocab_size = tok->vocab_size();
    options.token_bytes =
        token_bytes ? static_cast<uint32_t>(token_bytes) : (tok->vocab_size() <= 65536 ? 2 : 4);
    options.format = format == "llmc" ? ShardFormat::kLlmc : ShardFormat::kTessel;
    fs::create_directories(out_dir);

    ShardSink sink(out_dir, prefix, static_cast<size_t>(shard_tokens), options);
    Progress progress(inputs.size());
    // Files are read and encoded in batches of a few chunks per thread, so memory stays
    // bounded by the batch, and appended to the shards in input order.
    const size_t batch_bytes = static_cast<size_t>(std::max<int64_t>(chunk_bytes, 1 << 20)) *
                               static_cast<size_t>(threads) * 4;
    std::vector<Chunk> batch;
    size_t batched = 0;
    auto flush = [&] {
      encode_all(*tok, batch, static_cast<int>(threads), separator, progress);
      for (const auto& c : batch) sink.append(c.tokens);
      batch.clear();
      batched = 0;
    };
    for (const auto& input : inputs) {
      auto text = read_text(input);
      bool first = true;
      for (const auto& [b, e] : chunk_text(*text, static_cast<size_t>(chunk_bytes))) {
        batch.push_back({text, b, e, first, {}});
        first = false;
        batched += e - b;
      }
      progress.file_done();
      if (batched >= batch_bytes) flush();
    }
    flush();
    sink.finish();
    progress.finish(sink.shards());
    return 0;
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "\ntessel-tokenize: %s\n", e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\ntessel-tokenize: %s\n", e.what());
    return 1;
  }
}
