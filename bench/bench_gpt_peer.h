#pragma once
// What the GPT benches on one GPU (gpt_cuda_bench, fsdp_cuda_bench) share with their PyTorch
// peer scripts: the token batches and initial weights written where the script reads them, and
// the script's result line "torch <mode> <median seconds per step> <peak bytes> <loss>...".

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tessel/base/error.h"
#include "tessel/nn/gpt.h"

namespace tessel::bench {

// One setup's figures.
struct GptRun {
  std::string name;
  double step_s = 0;  // median seconds per step after the warm-up
  int64_t peak_bytes = 0;
  std::vector<double> losses;
  std::string note;   // why there is no result
};

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// `steps` batches of B x (T + 1) i32 tokens, uniform over the vocabulary (one seed).
inline std::vector<int32_t> make_tokens(int64_t steps, int64_t batch, int64_t seq, int64_t vocab) {
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(steps * batch * (seq + 1)));
  for (auto& t : tokens) t = token(rng);
  return tokens;
}

// Writes dir/tokens.i32 and dir/init.safetensors (a fresh model of `config`: tessel's initial
// weights, which the peer loads).
inline void write_peer_inputs(const std::filesystem::path& dir, const std::vector<int32_t>& tokens,
                              const nn::GptConfig& config) {
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / "tokens.i32", std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(int32_t)));
  nn::GPT(config).save((dir / "init.safetensors").string());
}

// Runs the peer's command line and reads its result line; other output becomes the note when
// it fails.
inline GptRun run_peer(const std::string& cmd, const std::string& name) {
  GptRun r;
  r.name = name;
  FILE* p = ::popen(cmd.c_str(), "r");
  TESSEL_CHECK(p != nullptr, IoError, "cannot start '{}'", cmd);
  char line[1 << 16];
  std::string tail;
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    const std::string s(line);
    if (s.rfind("torch ", 0) != 0) {
      tail += s;
      continue;
    }
    std::istringstream in(s);
    std::string word, mode;
    in >> word >> mode >> r.step_s >> r.peak_bytes;
    double loss = 0;
    while (in >> loss) r.losses.push_back(loss);
  }
  const int status = ::pclose(p);
  if (status != 0 || r.step_s <= 0) {
    r.note = fmt::format("failed (status {}): {}", status,
                         tail.size() > 2000 ? tail.substr(tail.size() - 2000) : tail);
  }
  return r;
}

}  // namespace tessel::bench
