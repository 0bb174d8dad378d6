// bench/tokenize: tessel's BPE encoder beside tiktoken on the same text, ranks file and pattern,
// single-threaded and multi-threaded, in one run; then the TokenLoader's throughput in tokens/s.
// Prints the CPU's model and features and the load average first, and each side's MB/s with
// the ratio. tiktoken runs in a child Python (bench/tokenize/tiktoken_bench.py) on the same
// chunks; bench/tokenize/run.sh makes its venv. Figures are medians over --repeats.
//
//   bench/tokenize/run.sh                 # builds this and runs it on the demo's real corpus
//   build/release/bench/bench_tokenize --ranks R --text T --python none   # tessel alone

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_host.h"
#include "tessel/data/bpe_tokenizer.h"
#include "tessel/data/token_loader.h"
#include "tessel/data/token_shard.h"

namespace {

using namespace tessel;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// About `n` chunk boundaries (byte offsets, first 0, last text.size()), each just after a
// '\n'. Both encoders get the same chunks, so their ids are compared chunk for chunk.
std::vector<size_t> chunk_cuts(const std::string& text, size_t n) {
  std::vector<size_t> cuts = {0};
  const size_t step = std::max<size_t>(1, text.size() / n);
  for (size_t at = step; at < text.size(); at += step) {
    const size_t nl = text.find('\n', std::max(at, cuts.back()));
    if (nl == std::string::npos || nl + 1 >= text.size()) break;
    cuts.push_back(nl + 1);
    at = nl + 1;
  }
  cuts.push_back(text.size());
  return cuts;
}

}  // namespace

int main(int argc, char** argv) {
  std::string ranks, text_path, python = "none", skip_reason, script;
  int threads = 2, repeats = 5;
  int64_t loader_batches = 400;
  CLI::App app{"bench_tokenize: tessel's BPE beside tiktoken, and the TokenLoader's tokens/s"};
  app.add_option("--ranks", ranks, "a tiktoken ranks file")->required();
  app.add_option("--text", text_path, "the text to encode")->required();
  app.add_option("--python", python, "a Python with tiktoken, or none");
  app.add_option("--skip-reason", skip_reason, "why there is no tiktoken (printed)");
  app.add_option("--tiktoken-script", script, "bench/tokenize/tiktoken_bench.py");
  app.add_option("--threads", threads, "threads of the multi-threaded rows");
  app.add_option("--repeats", repeats, "timed passes per row (the median is printed)");
  app.add_option("--loader-batches", loader_batches, "TokenLoader batches timed");
  CLI11_PARSE(app, argc, argv);

  const std::string text = slurp(text_path);
  const std::string_view pattern = data::kCl100kPattern;
  const auto tok = data::BpeTokenizer::from_tiktoken(ranks, pattern, {});
  const std::vector<size_t> cuts = chunk_cuts(text, 64);
  std::vector<std::string_view> chunks;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    chunks.emplace_back(text.data() + cuts[i], cuts[i + 1] - cuts[i]);
  }
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("cpu: %s\n",
              bench::cpu_features({"sse4_2", "avx2", "bmi2", "avx512f", "avx512bw", "avx512_vbmi2"})
                  .c_str());
  std::printf("cpus online: %u; load average at the start: %s\n",
              std::thread::hardware_concurrency(), bench::load_average().c_str());
  std::printf("text: %s, %.2f MB in %zu chunks; ranks %s (%zu ids), pattern cl100k\n\n",
              text_path.c_str(), mb, chunks.size(), ranks.c_str(),
              static_cast<size_t>(tok.vocab_size()));

  // tessel, one thread: every chunk in order (each pass from a cold per-thread word cache).
  std::vector<double> single, multi;
  size_t tessel_tokens = 0;
  for (int r = 0; r < repeats; ++r) {
    std::thread([&] {  // a fresh thread: a cold word cache, as tiktoken has none
      const auto start = Clock::now();
      size_t n = 0;
      for (auto c : chunks) n += tok.encode_ordinary(c).size();
      single.push_back(seconds_since(start));
      tessel_tokens = n;
    })
        .join();
    // `threads` threads taking chunks in turn.
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (size_t i = t; i < chunks.size(); i += threads) tok.encode_ordinary(chunks[i]);
      });
    }
    for (auto& th : pool) th.join();
    multi.push_back(seconds_since(start));
  }

  // tiktoken, same chunks, in a child process.
  nlohmann::json peer;
  if (python != "none") {
    const fs::path dir = fs::temp_directory_path() / fmt::format("tessel_tok_bench_{}", getpid());
    fs::create_directories(dir);
    std::ofstream(dir / "pattern.txt") << pattern;
    {
      std::ofstream cut_file(dir / "cuts.txt");
      for (size_t c : cuts) cut_file << c << "\n";
    }
    const std::string command = fmt::format("'{}' '{}' '{}' '{}' '{}' '{}' {} {}", python, script,
                                            ranks, (dir / "pattern.txt").string(), text_path,
                                            (dir / "cuts.txt").string(), threads, repeats);
    std::string out;
    if (FILE* p = popen(command.c_str(), "r")) {
      char buf[4096];
      while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
      if (pclose(p) != 0) skip_reason = "tiktoken_bench.py failed: " + out;
    }
    fs::remove_all(dir);
    if (skip_reason.empty()) peer = nlohmann::json::parse(out, nullptr, false);
    if (peer.is_discarded()) skip_reason = "tiktoken_bench.py printed no JSON: " + out;
  }

  std::printf("%-44s %10s %10s %10s\n", "encoder", "MB/s", "tokens", "vs tiktoken");
  const bool have_peer = skip_reason.empty() && python != "none";
  const double peer_single = have_peer ? mb / peer["single_s"].get<double>() : 0;
  const double peer_multi = have_peer ? mb / peer["multi_s"].get<double>() : 0;
  auto row = [&](const std::string& name, double mbs, size_t tokens, double ref) {
    const std::string ratio = ref > 0 ? fmt::format("{:.2f}x", mbs / ref) : "-";
    std::printf("%-44s %10.1f %10zu %10s\n", name.c_str(), mbs, tokens, ratio.c_str());
  };
  row("tessel BpeTokenizer, 1 thread", mb / median(single), tessel_tokens, peer_single);
  row(fmt::format("tessel BpeTokenizer, {} threads", threads), mb / median(multi), tessel_tokens,
      peer_multi);
  if (have_peer) {
    const size_t peer_tokens = peer["tokens"].get<size_t>();
    row(fmt::format("tiktoken {} encode_ordinary, 1 thread", peer["version"].get<std::string>()),
        peer_single, peer_tokens, peer_single);
    row(fmt::format("tiktoken encode_ordinary_batch, {} threads", threads), peer_multi, peer_tokens,
        peer_multi);
    std::printf("ids: %s\n",
                peer_tokens == tessel_tokens ? "the same count on both sides" : "COUNTS DIFFER");
  } else {
    std::printf("tiktoken: skipped: %s\n",
                skip_reason.empty() ? "--python none" : skip_reason.c_str());
  }

  // The loader: shards of these tokens (repeated to 8 M), batches of 32 x 1024 on one rank,
  // each made into int64 input and target tensors as train_gpt does.
  const fs::path dir = fs::temp_directory_path() / fmt::format("tessel_loader_bench_{}", getpid());
  fs::create_directories(dir);
  std::vector<uint32_t> ids;
  for (auto c : chunks) {
    const auto part = tok.encode_ordinary(c);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  std::vector<fs::path> shards;
  for (int s = 0; s < 4; ++s) {
    std::vector<uint32_t> shard;
    while (shard.size() < 2'000'000) shard.insert(shard.end(), ids.begin(), ids.end());
    shards.push_back(dir / fmt::format("shard_{:06}.bin", s));
    data::write_token_shard(shards.back(), shard, {.token_bytes = 2});
  }
  data::TokenLoader loader(shards, {.seq_len = 1024, .global_batch = 32, .seed = 1});
  std::vector<double> per_batch;
  for (int64_t b = 0; b < loader_batches; ++b) {
    const auto start = Clock::now();
    const data::TokenBatch batch = loader.next();
    const Tensor x = batch.inputs(), y = batch.targets();
    per_batch.push_back(seconds_since(start));
  }
  fs::remove_all(dir);
  const double tokens_per_batch = 32.0 * 1024;
  std::printf(
      "\nTokenLoader (4 shards of 2 M tokens, shuffled, batches of 32 x 1024, inputs and targets "
      "as int64 tensors): %.1f M tokens/s (median of %lld batches)\n",
      tokens_per_batch / median(per_batch) / 1e6, static_cast<long long>(loader_batches));
  return 0;
}
