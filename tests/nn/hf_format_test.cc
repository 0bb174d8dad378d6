// Hugging Face folders both ways: tiny LlamaForCausalLM and GPT2LMHeadModel fixtures made by
// transformers (tests/nn/hf/make_fixtures.py; committed, so no PyTorch is needed here) load and
// give transformers' logits; exports reload to the same logits; bad folders fail naming the
// tensor and leave the model as it was. With a Python that has transformers
// (TESSEL_TEST_TORCH_PYTHON, or /tmp/hf-venv/bin/python), transformers loads tessel's exports.
#include "tessel/nn/hf_format.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/safetensors.h"

namespace tessel::nn {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = TESSEL_HF_FIXTURE_DIR;

// max |a - b| / max |b|: the error relative to the logits' scale (elementwise relative error
// is meaningless at logits near zero).
double relative_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<float> x = to_vector<float>(a), y = to_vector<float>(b);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::abs(static_cast<double>(y[i])));
  }
  return diff / std::max(scale, 1e-30);
}

Tensor logits_of(Module& model, const Tensor& ids) {
  NoGradGuard no_grad;
  model.eval();
  return model(ids);
}

// A fresh folder under the temp directory, removed with the object.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() / ("tessel_hf_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// Message of the InvalidArgument `fn` throws ("" and a test failure when none).
template <typename Fn>
std::string invalid_argument_of(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidArgument";
  return "";
}

// --- transformers' fixtures ------------------------------------------------------------------

class HfFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixtureTest, LogitsMatchTransformers) {
  const fs::path dir = kFixtures / GetParam();
  const SafetensorsFile io = load_safetensors((dir / "io.safetensors").string());
  HfModel hf = load_hf_model(dir.string());
  const Tensor logits = logits_of(*hf.model, io.tensors.at("input_ids"));
  const double err = relative_error(logits, io.tensors.at("logits"));
  EXPECT_LE(err, 1e-5) << GetParam();
  std::printf("%s: relative error %.3g against transformers\n", GetParam().c_str(), err);
}

TEST_P(HfFixtureTest, ExportReloadsToTheSameLogits) {
  const fs::path dir = kFixtures / GetParam();
  const Tensor ids = load_safetensors((dir / "io.safetensors").string()).tensors.at("input_ids");
  HfModel hf = load_hf_model(dir.string());
  const Tensor expected = logits_of(*hf.model, ids);
  for (uint64_t shard_bytes : {uint64_t{5'000'000'000}, uint64_t{4096}}) {
    TempDir out("roundtrip_" + GetParam());
    save_hf(*hf.model, out.str(), {.max_shard_bytes = shard_bytes});
    EXPECT_EQ(fs::exists(out.path() / "model.safetensors.index.json"), shard_bytes == 4096);
    EXPECT_NE(fs::exists(out.path() / "model.safetensors"), shard_bytes == 4096);
    HfModel back = load_hf_model(out.str());
    EXPECT_EQ(relative_error(logits_of(*back.model, ids), expected), 0.0) << shard_bytes;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFixtureTest,
                         ::testing::Values("llama_gqa_untied", "llama_mha_tied",
                                           "llama_gqa_tied_llama3", "llama_mha_untied_llama3",
                                           "gpt2"));

TEST(HfFormatTest, ConfigsMapToTesselConfigs) {
  const HfConfig gqa = read_hf_config((kFixtures / "llama_gqa_untied").string());
  EXPECT_EQ(gqa.architecture, HfArchitecture::kLlama);
  EXPECT_EQ(gqa.llama.dim, 32);
  EXPECT_EQ(gqa.llama.n_heads, 4);
  EXPECT_EQ(gqa.llama.kv_heads(), 2);
  EXPECT_EQ(gqa.llama.ffn_hidden(), 48);
  EXPECT_FALSE(gqa.llama.tie_word_embeddings);
  EXPECT_FALSE(gqa.llama.rope_scaling.has_value());
  EXPECT_EQ(gqa.dtype, DType::kF32);

  const HfConfig scaled = read_hf_config((kFixtures / "llama_gqa_tied_llama3").string());
  EXPECT_TRUE(scaled.llama.tie_word_embeddings);
  ASSERT_TRUE(scaled.llama.rope_scaling.has_value());
  EXPECT_EQ(scaled.llama.rope_scaling->factor, 4.0);
  EXPECT_EQ(scaled.llama.rope_scaling->original_max_position_embeddings, 64);
  EXPECT_EQ(scaled.llama.rope_theta, 10000.0);
  EXPECT_EQ(scaled.dtype, DType::kBF16);

  const HfConfig gpt = read_hf_config((kFixtures / "gpt2").string());
  EXPECT_EQ(gpt.architecture, HfArchitecture::kGpt2);
  EXPECT_EQ(gpt.gpt.n_embd, 16);
  EXPECT_EQ(gpt.gpt.block_size, 32);
  EXPECT_EQ(gpt.gpt.n_head, 2);

  // transformers 4's keys (rope_theta and rope_scaling at the top level) read the same.
  const HfConfig v4 = parse_hf_config(
      R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 16,
          "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
          "rope_theta": 500000.0, "torch_dtype": "float16",
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
      "v4");
  EXPECT_EQ(v4.llama.rope_theta, 500000.0);
  ASSERT_TRUE(v4.llama.rope_scaling.has_value());
  EXPECT_EQ(v4.llama.rope_scaling->factor, 8.0);
  EXPECT_EQ(v4.llama.kv_heads(), 2);
  EXPECT_EQ(v4.dtype, DType::kF16);
}

TEST(HfFormatTest, PublishedLlama32ConfigGivesThePresetsShapes) {
  // meta-llama/Llama-3.2-1B's config.json, as published.
  const HfConfig c = parse_hf_config(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})",
                                     "Llama-3.2-1B");
  const LlamaConfig preset = LlamaConfig::llama3_2_1b();
  EXPECT_EQ(c.llama.num_parameters(), preset.num_parameters());
  EXPECT_EQ(c.llama.kv_heads(), preset.kv_heads());
  EXPECT_EQ(c.llama.head_size(), preset.head_size());
  EXPECT_EQ(c.llama.ffn_hidden(), preset.ffn_hidden());
  EXPECT_EQ(c.llama.max_seq_len, preset.max_seq_len);
  EXPECT_EQ(c.llama.rope_theta, preset.rope_theta);
  ASSERT_TRUE(c.llama.rope_scaling.has_value());
  EXPECT_EQ(c.llama.rope_scaling->factor, preset.rope_scaling->factor);
  EXPECT_EQ(c.llama.rope_scaling->original_max_position_embeddings,
            preset.rope_scaling->original_max_position_embeddings);
  EXPECT_TRUE(c.llama.tie_word_embeddings);
  EXPECT_EQ(c.dtype, DType::kBF16);
}

TEST(HfFormatTest, Gpt2Conv1DWeightsAreTransposedInTheFile) {
  const fs::path dir = kFixtures / "gpt2";
  HfModel hf = load_hf_model(dir.string());
  const SafetensorsFile file = load_safetensors((dir / "model.safetensors").string());
  for (const char* name : {"transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.weight",
                           "transformer.h.1.mlp.c_proj.weight"}) {
    const Tensor ours = hf.model->parameter(name);
    const Tensor theirs = file.tensors.at(name);
    ASSERT_EQ(ours.size(0), theirs.size(1)) << name;
    EXPECT_EQ(relative_error(ours, contiguous(transpose(theirs, 0, 1))), 0.0) << name;
  }
  TempDir out("gpt2_transpose");
  save_hf(*hf.model, out.str());
  const SafetensorsFile written = load_safetensors((out.path() / "model.safetensors").string());
  EXPECT_EQ(written.metadata.at("format"), "pt");
  EXPECT_FALSE(written.tensors.count("lm_head.weight"));  // tied: transformers ties it again
  for (const auto& [name, t] : file.tensors) {
    ASSERT_TRUE(written.tensors.count(name)) << name;
    EXPECT_EQ(written.tensors.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(relative_error(written.tensors.at(name), t), 0.0) << name;
  }
}

TEST(HfFormatTest, Gpt2SavedFromTheBaseModelWithOldBuffersLoads) {
  // The hub's original gpt2 file: names without "transformer.", and the causal-mask buffers
  // (attn.bias, attn.masked_bias) older transformers versions saved.
  const fs::path fixture = kFixtures / "gpt2";
  const SafetensorsFile io = load_safetensors((fixture / "io.safetensors").string());
  TempDir dir("gpt2_base");
  fs::copy_file(fixture / "config.json", dir.path() / "config.json");
  const SafetensorsFile file = load_safetensors((fixture / "model.safetensors").string());
  TensorMap base;
  for (const auto& [name, t] : file.tensors) base.emplace(name.substr(12), t);
  ASSERT_TRUE(base.count("wte.weight"));
  base.emplace("h.0.attn.bias", ones({1, 1, 32, 32}));
  base.emplace("h.1.attn.masked_bias", full({}, -1e4));
  save_safetensors((dir.path() / "model.safetensors").string(), base, file.metadata);
  HfModel hf = load_hf_model(dir.str());
  EXPECT_LE(
      relative_error(logits_of(*hf.model, io.tensors.at("input_ids")), io.tensors.at("logits")),
      1e-5);
}

TEST(HfFormatTest, Bf16AndF16LoadIntoTheModelsDtypeAndExportInTheAskedOne) {
  // Weights stored in bf16 load into an f32 model exactly and into a bf16 model as they are.
  const fs::path dir = kFixtures / "llama_gqa_tied_llama3";
  const SafetensorsFile file = load_safetensors((dir / "model.safetensors").string());
  const Tensor stored = file.tensors.at("model.layers.1.mlp.up_proj.weight");
  ASSERT_EQ(stored.dtype(), DType::kBF16);
  HfModel f32 = load_hf_model(dir.string());
  EXPECT_EQ(f32.model->parameter("model.layers.1.mlp.up_proj.weight").dtype(), DType::kF32);
  EXPECT_EQ(relative_error(f32.model->parameter("model.layers.1.mlp.up_proj.weight"),
                           to(stored, DType::kF32)),
            0.0);
  HfModel bf16 = load_hf_model(dir.string(), DType::kBF16);
  EXPECT_EQ(bf16.model->parameter("model.layers.1.mlp.up_proj.weight").dtype(), DType::kBF16);

  TempDir out("bf16");
  save_hf(*f32.model, out.str(), {.dtype = DType::kF16});
  EXPECT_EQ(read_hf_config(out.str()).dtype, DType::kF16);
  const SafetensorsFile written = load_safetensors((out.path() / "model.safetensors").string());
  EXPECT_EQ(written.tensors.at("model.norm.weight").dtype(), DType::kF16);
}

// --- Shards ----------------------------------------------------------------------------------

// Rank `rank` of `world`'s part of `full`: rows (dim 0) or, for every other 2-D tensor, columns
// (dim 1, as a row-parallel weight), chunked as FSDP chunks, with the box in shard_info.
Tensor shard_of(const Tensor& full, int64_t dim, int64_t rank, int64_t world) {
  const int64_t n = full.size(dim), step = (n + world - 1) / world;
  const int64_t begin = std::min(n, rank * step), size = std::min(step, n - begin);
  Shape offset(full.dim(), 0);
  offset[dim] = begin;
  Tensor part = contiguous(narrow(full, dim, begin, size));
  part.set_shard_info(std::make_shared<ShardInfo>(ShardInfo{full.shape(), offset, nullptr}));
  return part;
}

TEST(HfFormatTest, ShardsReadOnlyTheirBoxes) {
  for (const char* name : {"llama_gqa_untied", "llama_mha_tied", "gpt2"}) {
    const std::string dir = (kFixtures / name).string();
    HfModel whole = load_hf_model(dir);
    for (int64_t world : {1, 2, 3}) {
      uint64_t read = 0, in_files = 0;
      for (int64_t rank = 0; rank < world; ++rank) {
        HfModel part = load_hf_model(dir);
        int64_t i = 0;
        std::map<std::string, std::pair<int64_t, Tensor>> boxes;
        for (const auto& [pname, p] : part.model->named_parameters()) {
          const int64_t dim = p.dim() == 2 && (i++ % 2 == 1) ? 1 : 0;
          // The expected values come from the whole model; the shard starts as zeros.
          const Tensor expected = shard_of(whole.model->parameter(pname), dim, rank, world);
          Tensor shard = zeros_like(expected);
          shard.set_shard_info(std::make_shared<ShardInfo>(*expected.shard_info()));
          part.model->set_parameter(pname, shard);
          boxes.emplace(pname, std::make_pair(dim, expected));
        }
        const HfLoadStats stats = load_hf_weights(*part.model, dir);
        for (const auto& [pname, box] : boxes) {
          EXPECT_EQ(relative_error(part.model->parameter(pname), box.second), 0.0)
              << name << " " << pname << " dim " << box.first << " rank " << rank << "/" << world;
        }
        read += stats.bytes_read;
        in_files = stats.bytes_in_files;
        EXPECT_LE(stats.bytes_read, (stats.bytes_in_files + world - 1) / world + 4096)
            << name << " rank " << rank << "/" << world;
      }
      // The ranks together read every byte of every tensor exactly once.
      EXPECT_EQ(read, in_files) << name << " world " << world;
    }
  }
}

// --- Errors ----------------------------------------------------------------------------------

// A copy of a fixture whose weights `edit` changes, written back as one model.safetensors.
template <typename Edit>
void copy_with_edited_weights(const fs::path& from, const TempDir& to_dir, Edit&& edit) {
  fs::copy_file(from / "config.json", to_dir.path() / "config.json",
                fs::copy_options::overwrite_existing);
  SafetensorsFile f = load_safetensors((from / "model.safetensors").string());
  edit(f.tensors);
  save_safetensors((to_dir.path() / "model.safetensors").string(), f.tensors, f.metadata);
}

TEST(HfFormatTest, BadFoldersNameTheTensorAndChangeNothing) {
  const fs::path fixture = kFixtures / "llama_mha_tied";
  HfModel hf = load_hf_model(fixture.string());
  Module& model = *hf.model;
  const Tensor before = clone(model.parameter("model.layers.0.self_attn.k_proj.weight"));
  auto unchanged = [&] {
    EXPECT_EQ(relative_error(model.parameter("model.layers.0.self_attn.k_proj.weight"), before),
              0.0);
  };
  // Every later tensor of the file holds other values: a half-load would show.
  auto perturb = [](TensorMap& t) {
    for (auto& [name, w] : t) w = add(w, full_like(w, 1.0));
  };

  {
    TempDir dir("missing");
    copy_with_edited_weights(fixture, dir, [&](TensorMap& t) {
      perturb(t);
      t.erase("model.layers.1.mlp.down_proj.weight");
    });
    const std::string msg = invalid_argument_of([&] { load_hf_weights(model, dir.str()); });
    EXPECT_NE(msg.find("missing tensors: model.layers.1.mlp.down_proj.weight"), std::string::npos)
        << msg;
    unchanged();
  }
  {
    TempDir dir("extra");
    copy_with_edited_weights(fixture, dir, [&](TensorMap& t) {
      perturb(t);
      t.emplace("model.layers.2.mlp.up_proj.weight", zeros({48, 32}));
    });
    const std::string msg = invalid_argument_of([&] { load_hf_weights(model, dir.str()); });
    EXPECT_NE(msg.find("unexpected tensors: model.layers.2.mlp.up_proj.weight"), std::string::npos)
        << msg;
    unchanged();
  }
  {
    TempDir dir("shape");
    copy_with_edited_weights(fixture, dir, [&](TensorMap& t) {
      perturb(t);
      t["model.layers.0.mlp.gate_proj.weight"] = zeros({47, 32});
    });
    const std::string msg = invalid_argument_of([&] { load_hf_weights(model, dir.str()); });
    EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight (expected (48, 32)"), std::string::npos)
        << msg;
    unchanged();
  }
  {
    TempDir dir("dtype");
    copy_with_edited_weights(fixture, dir, [&](TensorMap& t) {
      perturb(t);
      t["model.norm.weight"] = zeros({32}, DType::kI64);
    });
    const std::string msg = invalid_argument_of([&] { load_hf_weights(model, dir.str()); });
    EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("I64"), std::string::npos) << msg;
    unchanged();
  }
  {
    TempDir dir("tied_head");  // a tied model's stored lm_head must be the embedding
    copy_with_edited_weights(fixture, dir, [&](TensorMap& t) {
      t.emplace("lm_head.weight", add(t.at("model.embed_tokens.weight"), full({64, 32}, 1.0)));
    });
    const std::string msg = invalid_argument_of([&] { load_hf_weights(model, dir.str()); });
    EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;
    unchanged();
  }
  {
    TempDir dir("tied_head_same");  // ... and is accepted when it is
    copy_with_edited_weights(fixture, dir, [&](TensorMap& t) {
      t.emplace("lm_head.weight", clone(t.at("model.embed_tokens.weight")));
    });
    EXPECT_NO_THROW(load_hf_weights(model, dir.str()));
  }
  // Another architecture: the config names it, and a GPT-2 folder does not load into a Llama.
  {
    TempDir dir("mistral");
    std::string config = read_file(fixture / "config.json");
    config.replace(config.find("LlamaForCausalLM"), 16, "MistralForCausalLM");
    write_file(dir.path() / "config.json", config);
    const std::string msg = invalid_argument_of([&] { load_hf_model(dir.str()); });
    EXPECT_NE(msg.find("unknown architecture \"MistralForCausalLM\""), std::string::npos) << msg;
  }
  {
    const std::string msg =
        invalid_argument_of([&] { load_hf_weights(model, (kFixtures / "gpt2").string()); });
    EXPECT_NE(msg.find("GPT2LMHeadModel"), std::string::npos) << msg;
    unchanged();
  }
  {
    TempDir dir("rope");
    std::string config = read_file(fixture / "config.json");
    const std::string type = R"("rope_type": "default")";
    ASSERT_NE(config.find(type), std::string::npos) << config;
    config.replace(config.find(type), type.size(), R"("rope_type": "yarn")");
    write_file(dir.path() / "config.json", config);
    const std::string msg = invalid_argument_of([&] { read_hf_config(dir.str()); });
    EXPECT_NE(msg.find("\"yarn\""), std::string::npos) << msg;
  }
  // A model of other shapes: the first mismatched tensor is named with both shapes.
  {
    LlamaConfig other = hf.config.llama;
    other.ffn_hidden_size = 40;
    Llama small(other);
    const std::string msg = invalid_argument_of([&] { load_hf_weights(small, fixture.string()); });
    EXPECT_NE(msg.find("model.layers.0.mlp.up_proj.weight (expected (40, 32) float, got (48, 32)"),
              std::string::npos)
        << msg;
  }
}

TEST(HfFormatTest, IndexNamingAFileOutsideTheFolderOrAnAbsentTensorFails) {
  const fs::path fixture = kFixtures / "llama_gqa_untied";
  TempDir dir("index");
  for (const auto& e : fs::directory_iterator(fixture)) {
    fs::copy_file(e.path(), dir.path() / e.path().filename());
  }
  const fs::path index = dir.path() / "model.safetensors.index.json";
  const std::string original = read_file(index);
  std::string outside = original;
  const std::string shard = "model-00001-of-00003.safetensors";
  outside.replace(outside.find(shard), shard.size(), "../x.safetensors");
  write_file(index, outside);
  std::string msg = invalid_argument_of([&] { load_hf_model(dir.str()); });
  EXPECT_NE(msg.find("a file outside"), std::string::npos) << msg;

  // Point one name at a shard that does not hold it.
  const size_t at = original.find("\"model.norm.weight\": \"");
  ASSERT_NE(at, std::string::npos) << original;
  std::string wrong = original;
  const size_t file_at = at + std::string("\"model.norm.weight\": \"").size();
  const std::string current = wrong.substr(file_at, shard.size());
  wrong.replace(file_at, shard.size(),
                current == shard ? "model-00002-of-00003.safetensors" : shard);
  write_file(index, wrong);
  msg = invalid_argument_of([&] { load_hf_model(dir.str()); });
  EXPECT_NE(msg.find("model.norm.weight (listed in"), std::string::npos) << msg;
}

TEST(HfFormatTest, OtherModulesAreRefused) {
  Module plain("Plain");
  plain.register_parameter("w", zeros({2}));
  TempDir dir("plain");
  const std::string msg = invalid_argument_of([&] { save_hf(plain, dir.str()); });
  EXPECT_NE(msg.find("Plain"), std::string::npos) << msg;

  // A sharded model would write its shards as if they were whole tensors.
  HfModel hf = load_hf_model((kFixtures / "gpt2").string());
  hf.model->set_parameter("transformer.ln_f.weight",
                          shard_of(hf.model->parameter("transformer.ln_f.weight"), 0, 1, 2));
  const std::string sharded = invalid_argument_of([&] { save_hf(*hf.model, dir.str()); });
  EXPECT_NE(sharded.find("transformer.ln_f.weight' is a shard"), std::string::npos) << sharded;
  EXPECT_FALSE(fs::exists(dir.path() / "config.json"));
}

// --- transformers loads tessel's export ------------------------------------------------------

// The Python to run transformers with, or "" and the reason it is absent.
std::string torch_python(std::string* reason) {
  std::string python;
  if (const char* env = std::getenv("TESSEL_TEST_TORCH_PYTHON"); env && *env) {
    python = env;
  } else if (fs::exists("/tmp/hf-venv/bin/python")) {
    python = "/tmp/hf-venv/bin/python";
  } else {
    *reason = "no TESSEL_TEST_TORCH_PYTHON and no /tmp/hf-venv (scripts/hf_fixtures.sh makes it)";
    return "";
  }
  if (std::system((python + " -c 'import torch, transformers, safetensors' 2>/dev/null").c_str()) !=
      0) {
    *reason = python + " cannot import torch, transformers and safetensors";
    return "";
  }
  return python;
}

TEST(HfTransformersTest, TransformersLoadsTesselsExport) {
  std::string reason;
  const std::string python = torch_python(&reason);
  if (python.empty()) GTEST_SKIP() << "transformers not available: " << reason;

  LlamaConfig untied = LlamaConfig::tiny();  // GQA, llama3 scaling
  untied.seed = 5;
  LlamaConfig tied = untied;
  tied.n_kv_heads = 4;
  tied.tie_word_embeddings = true;
  tied.rope_scaling.reset();
  struct Case {
    std::string name;
    std::shared_ptr<Module> model;
    uint64_t shard_bytes;
  };
  const std::vector<Case> cases{
      {"llama_untied", std::make_shared<Llama>(untied), 100'000},  // sharded
      {"llama_tied", std::make_shared<Llama>(tied), 5'000'000'000},
      {"gpt2",
       std::make_shared<GPT>(GptConfig{
           .vocab_size = 96, .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 32, .seed = 3}),
       5'000'000'000},
  };
  std::mt19937 rng(11);
  for (const Case& c : cases) {
    TempDir dir("export_" + c.name);
    save_hf(*c.model, (dir.path() / "model").string(), {.max_shard_bytes = c.shard_bytes});
    std::vector<int64_t> tokens(20);
    for (int64_t& t : tokens) t = static_cast<int64_t>(rng() % 64);
    const Tensor ids = from_vector<int64_t>(tokens, {2, 10});
    const std::string io = (dir.path() / "io.safetensors").string();
    save_safetensors(io, {{"input_ids", ids}});
    const std::string cmd = python + " " + (kFixtures / "hf_logits.py").string() + " " +
                            (dir.path() / "model").string() + " " + io;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const Tensor theirs = load_safetensors(io).tensors.at("logits");
    const double err = relative_error(logits_of(*c.model, ids), theirs);
    EXPECT_LE(err, 1e-5) << c.name;
    std::printf("%s: transformers' logits of tessel's export, relative error %.3g\n",
                c.name.c_str(), err);
  }
}

}  // namespace
}  // namespace tessel::nn
