// Hugging Face folders loaded straight into models sharded by FSDP (Llama, GPT; 2 and 3 ranks)
// and FSDP x TP 2 x 2 (GPT) on rank threads: each rank reads exactly the bytes of its own shards
// (measured), and the sharded model's logits equal the single-process model's. A checkpoint
// those sharded models save exports (export_hf, tessel-ckpt export-hf) to a folder that loads
// to transformers' logits again. Fixtures: tests/nn/hf (made by transformers, see
// tests/nn/hf/make_fixtures.py).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/hf_format.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/checkpoint/hf_export.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/safetensors.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = TESSEL_HF_FIXTURE_DIR;

int64_t numel_of(const nn::Module& model) {
  int64_t n = 0;
  for (const Tensor& p : model.parameters()) n += p.numel();
  return n;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<float> x = to_vector<float>(a), y = to_vector<float>(b);
  double d = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(x[i]) - y[i]));
  }
  return d;
}

// The model `dir` describes, built on the meta device, sharded per block and at the root over
// `mesh` (after tensor parallelism over `tp`, when given: GPT only), given memory; its weights
// not yet loaded.
std::shared_ptr<nn::Module> sharded_model(const std::string& dir, const DeviceMesh& mesh,
                                          const DeviceMesh* tp = nullptr) {
  const nn::HfConfig config = nn::read_hf_config(dir);
  std::shared_ptr<nn::Module> model;
  std::string blocks;
  {
    DefaultDeviceGuard meta(Device::meta());
    if (config.architecture == nn::HfArchitecture::kLlama) {
      model = std::make_shared<nn::Llama>(config.llama);
      blocks = "model.layers";
    } else {
      model = std::make_shared<nn::GPT>(config.gpt);
      blocks = "transformer.h";
    }
  }
  if (tp != nullptr) parallelize_module(*model, *tp, gpt_tp_plan());
  nn::Module& list = model->submodule(blocks);
  for (const auto& [name, block] : list.children()) fully_shard(*block, mesh);
  fully_shard(*model, mesh);
  model->to_empty(Device::cpu());
  return model;
}

class HfFsdpLoadTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFsdpLoadTest, EachRankReadsItsShardsAndLogitsMatchOneProcess) {
  const std::string dir = (kFixtures / GetParam()).string();
  const Tensor ids = load_safetensors((kFixtures / GetParam() / "io.safetensors").string())
                         .tensors.at("input_ids");
  nn::HfModel whole = nn::load_hf_model(dir);
  Tensor expected;
  {
    NoGradGuard no_grad;
    whole.model->eval();
    expected = (*whole.model)(ids);
  }
  for (int world : {2, 3}) {
    std::vector<nn::HfLoadStats> stats(world);
    std::vector<double> diffs(world, -1);
    std::vector<int64_t> local(world, 0);
    threads::run_ranks(world, [&](ProcessGroup& pg) {
      const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {world}, {"dp"});
      std::shared_ptr<nn::Module> model = sharded_model(dir, mesh);
      stats[pg.rank()] = nn::load_hf_weights(*model, dir);
      local[pg.rank()] = numel_of(*model);
      NoGradGuard no_grad;
      model->eval();
      diffs[pg.rank()] = max_abs_diff((*model)(ids), expected);
    });
    uint64_t total = 0;
    const uint64_t element = stats[0].bytes_in_files / numel_of(*whole.model);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(stats[r].bytes_read, local[r] * element) << "exactly the rank's own shards";
      // Slack: FSDP's chunks round up, so a rank holds at most one row more of each tensor.
      const uint64_t share = stats[r].bytes_in_files / world;
      EXPECT_LE(stats[r].bytes_read, share + share / 20 + 4096)
          << GetParam() << " rank " << r << "/" << world;
      EXPECT_EQ(diffs[r], 0.0) << GetParam() << " rank " << r << "/" << world;
      total += stats[r].bytes_read;
      std::printf("%s FSDP %d rank %d: read %llu of %llu tensor bytes\n", GetParam().c_str(), world,
                  r, static_cast<unsigned long long>(stats[r].bytes_read),
                  static_cast<unsigned long long>(stats[r].bytes_in_files));
    }
    EXPECT_EQ(total, stats[0].bytes_in_files) << "every byte read once across the ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFsdpLoadTest,
                         ::testing::Values("llama_gqa_untied", "llama_gqa_tied_llama3", "gpt2"));

// FSDP x TP 2 x 2 on the GPT: c_attn is split by sections ((3C, C) viewed as (3, C, C)), the
// tied embedding by vocabulary rows; each rank's logits are its vocabulary columns.
TEST(HfFsdpTpLoadTest, Gpt2OnFsdpTimesTpMatchesOneProcessReadingOnlyOwnShards) {
  const std::string dir = (kFixtures / "gpt2").string();
  const Tensor ids =
      load_safetensors((kFixtures / "gpt2" / "io.safetensors").string()).tensors.at("input_ids");
  nn::HfModel whole = nn::load_hf_model(dir);
  Tensor expected;
  {
    NoGradGuard no_grad;
    whole.model->eval();
    expected = (*whole.model)(ids);
  }
  const int64_t V = expected.size(2);
  const double scale = max_abs_diff(expected, zeros_like(expected));  // max |logit|
  std::vector<nn::HfLoadStats> stats(4);
  std::vector<int64_t> local(4, 0);
  std::vector<double> diffs(4, -1);
  threads::run_ranks(4, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp_shard", "tp"});
    const DeviceMesh tp = mesh["tp"];
    std::shared_ptr<nn::Module> model = sharded_model(dir, mesh["dp_shard"], &tp);
    stats[pg.rank()] = nn::load_hf_weights(*model, dir);
    local[pg.rank()] = numel_of(*model);
    NoGradGuard no_grad;
    model->eval();
    const Tensor logits = (*model)(ids);  // (B, T, V / tp): this rank's vocabulary columns
    const int64_t cols = V / 2;
    diffs[pg.rank()] =
        max_abs_diff(logits, contiguous(narrow(expected, 2, mesh.local_rank("tp") * cols, cols)));
  });
  uint64_t total = 0;
  const uint64_t element = stats[0].bytes_in_files / numel_of(*whole.model);
  for (int r = 0; r < 4; ++r) {
    // Within f32 relative 1e-5 of the largest logit: the TP all_reduce reorders sums.
    EXPECT_LE(diffs[r], 1e-5 * scale) << "rank " << r;
    EXPECT_EQ(stats[r].bytes_read, local[r] * element) << "rank " << r;
    EXPECT_LE(stats[r].bytes_read, stats[r].bytes_in_files / 2) << "rank " << r;
    total += stats[r].bytes_read;
    std::printf(
        "gpt2 FSDP x TP 2 x 2 rank %d: read %llu of %llu tensor bytes, logits within %.3g\n", r,
        static_cast<unsigned long long>(stats[r].bytes_read),
        static_cast<unsigned long long>(stats[r].bytes_in_files), diffs[r]);
  }
  // Norms, biases of row-parallel layers and wpe are whole on both tp ranks: read twice.
  EXPECT_GE(total, stats[0].bytes_in_files);
}

// --- tessel-ckpt export-hf ------------------------------------------------------------------

// A fresh folder under the temp directory, removed with the object.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() /
              ("tessel_hf_ckpt_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Loads fixture `name` into a model sharded by FSDP over 2 rank threads and saves a
// distributed checkpoint of it at `ckpt`.
void save_sharded_checkpoint(const std::string& name, const std::string& ckpt) {
  const std::string dir = (kFixtures / name).string();
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"dp"});
    std::shared_ptr<nn::Module> model = sharded_model(dir, mesh);
    nn::load_hf_weights(*model, dir);
    checkpoint::CheckpointState state(pg.shared_from_this());
    state.add_model("model", *model);
    checkpoint::save(state, ckpt);
  });
}

double logits_error(const std::string& folder, const std::string& fixture) {
  const SafetensorsFile io = load_safetensors((kFixtures / fixture / "io.safetensors").string());
  nn::HfModel hf = nn::load_hf_model(folder);
  NoGradGuard no_grad;
  hf.model->eval();
  const Tensor& want = io.tensors.at("logits");
  return max_abs_diff((*hf.model)(io.tensors.at("input_ids")), want) /
         max_abs_diff(want, zeros_like(want));
}

TEST(HfExportFromCheckpointTest, LlamaWithItsConfigExportsToTransformersLogits) {
  TempDir tmp("llama");
  save_sharded_checkpoint("llama_gqa_untied", tmp / "ck");
  checkpoint::HfExportOptions options;
  options.config = nn::read_hf_config((kFixtures / "llama_gqa_untied").string());
  options.save.max_shard_bytes = 20'000;  // sharded output
  EXPECT_EQ(checkpoint::export_hf(tmp / "ck", tmp / "hf", options), 21);
  EXPECT_TRUE(fs::exists(tmp / "hf/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(tmp / "hf/.tessel-export-hf.safetensors"));
  EXPECT_LE(logits_error(tmp / "hf", "llama_gqa_untied"), 1e-5);

  // Without a config or heads, and with a config of other shapes: errors naming the problem.
  try {
    checkpoint::export_hf(tmp / "ck", tmp / "none", {});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("number of heads"), std::string::npos) << e.what();
  }
  options.config->llama.ffn_hidden_size = 40;
  try {
    checkpoint::export_hf(tmp / "ck", tmp / "other", options);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.up_proj.weight"), std::string::npos)
        << e.what();
  }
}

TEST(HfExportFromCheckpointTest, ToolExportsAGptReadOffTheTensors) {
  TempDir tmp("gpt2");
  save_sharded_checkpoint("gpt2", tmp / "ck");
  const std::string cmd = std::string(TESSEL_CKPT_PATH) + " export-hf " + (tmp / "ck") + " " +
                          (tmp / "hf") + " --gpt-heads 2 --dtype f32 > " + (tmp / "out.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nn::HfConfig config = nn::read_hf_config(tmp / "hf");
  EXPECT_EQ(config.gpt.n_layer, 2);
  EXPECT_EQ(config.gpt.block_size, 32);
  EXPECT_LE(logits_error(tmp / "hf", "gpt2"), 1e-5);
  // Bad input: exit status 3 and one line saying why.
  const std::string bad = std::string(TESSEL_CKPT_PATH) + " export-hf " + (tmp / "ck") + " " +
                          (tmp / "bad") + " 2> " + (tmp / "err.txt");
  EXPECT_EQ(WEXITSTATUS(std::system(bad.c_str())), 3);
  std::ifstream err(tmp / "err.txt");
  std::string line;
  std::getline(err, line);
  EXPECT_NE(line.find("number of heads"), std::string::npos) << line;
}

}  // namespace
}  // namespace tessel
