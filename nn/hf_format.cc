#include "tessel/nn/hf_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/device.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/safetensors.h"

namespace tessel::nn {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open for reading", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw IoError(fmt::format("{}: cannot write", path));
}

// --- config.json ---------------------------------------------------------------------------

// Typed reads of config.json keys; each error names the source and the key.
class ConfigReader {
 public:
  ConfigReader(const Json& json, std::string_view source) : json_(json), source_(source) {}

  bool has(const std::string& key) const { return json_.contains(key) && !json_[key].is_null(); }

  int64_t integer(const std::string& key) const {
    require(key);
    return integer_of(json_[key], key);
  }
  int64_t integer(const std::string& key, int64_t fallback) const {
    return has(key) ? integer_of(json_[key], key) : fallback;
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    TESSEL_CHECK(json_[key].is_number(), InvalidArgument, "{}: \"{}\" must be a number, got {}",
                 source_, key, json_[key].dump());
    return json_[key].get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    TESSEL_CHECK(json_[key].is_boolean(), InvalidArgument,
                 "{}: \"{}\" must be true or false, got {}", source_, key, json_[key].dump());
    return json_[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    TESSEL_CHECK(json_[key].is_string(), InvalidArgument, "{}: \"{}\" must be a string, got {}",
                 source_, key, json_[key].dump());
    return json_[key].get<std::string>();
  }
  // A key whose value, when present, must be `expected` (a setting tessel does not implement).
  void expect_false(const std::string& key) const {
    TESSEL_CHECK(!boolean(key, false), InvalidArgument,
                 "{}: \"{}\": true is not supported (tessel's model has no such option)", source_,
                 key);
  }

 private:
  void require(const std::string& key) const {
    TESSEL_CHECK(has(key), InvalidArgument, "{}: missing \"{}\"", source_, key);
  }
  int64_t integer_of(const Json& v, const std::string& key) const {
    TESSEL_CHECK(v.is_number_integer(), InvalidArgument, "{}: \"{}\" must be an integer, got {}",
                 source_, key, v.dump());
    return v.get<int64_t>();
  }

  const Json& json_;
  std::string_view source_;
};

std::optional<DType> parse_torch_dtype(const ConfigReader& r, std::string_view source) {
  const std::string key = r.has("torch_dtype") ? "torch_dtype" : "dtype";
  if (!r.has(key)) return std::nullopt;
  const std::string name = r.string(key, "");
  if (name == "float32") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  throw InvalidArgument(fmt::format("{}: \"{}\" is \"{}\"; expected float32, bfloat16 or float16",
                                    source, key, name));
}

std::string torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    default:
      break;
  }
  throw InvalidArgument(fmt::format("Hugging Face weights are float32, bfloat16 or float16, not {}",
                                    dtype_name(dtype)));
}

LlamaConfig parse_llama(const Json& json, std::string_view source) {
  const ConfigReader r(json, source);
  LlamaConfig c;
  c.vocab_size = r.integer("vocab_size");
  c.dim = r.integer("hidden_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.n_kv_heads = r.integer("num_key_value_heads", c.n_heads);
  c.head_dim = r.integer("head_dim", 0);
  c.ffn_hidden_size = r.integer("intermediate_size");
  c.norm_eps = r.number("rms_norm_eps", 1e-6);
  c.max_seq_len = r.integer("max_position_embeddings", 2048);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.initializer_range = r.number("initializer_range", 0.02);
  const std::string act = r.string("hidden_act", "silu");
  TESSEL_CHECK(act == "silu", InvalidArgument,
               "{}: \"hidden_act\" is \"{}\"; tessel's Llama MLP is SwiGLU (\"silu\")", source,
               act);
  r.expect_false("attention_bias");
  r.expect_false("mlp_bias");

  // transformers 4 keeps "rope_theta" and "rope_scaling"; 5 puts both in "rope_parameters".
  const char* rope_key = r.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  c.rope_theta = r.number("rope_theta", 10000.0);
  c.rope_scaling.reset();
  if (r.has(rope_key)) {
    TESSEL_CHECK(json[rope_key].is_object(), InvalidArgument,
                 "{}: \"{}\" must be an object, got {}", source, rope_key, json[rope_key].dump());
    const std::string where = fmt::format("{} \"{}\"", source, rope_key);
    const ConfigReader rope(json[rope_key], where);
    c.rope_theta = rope.number("rope_theta", c.rope_theta);
    const std::string type = rope.string("rope_type", rope.string("type", "default"));
    if (type == "llama3") {
      c.rope_scaling =
          kernels::RopeScaling{.factor = rope.number("factor", 8.0),
                               .low_freq_factor = rope.number("low_freq_factor", 1.0),
                               .high_freq_factor = rope.number("high_freq_factor", 4.0),
                               .original_max_position_embeddings =
                                   rope.integer("original_max_position_embeddings", 8192)};
    } else {
      TESSEL_CHECK(type == "default", InvalidArgument,
                   "{}: rope type \"{}\" is not supported (tessel has \"default\" and \"llama3\")",
                   where, type);
    }
  }
  return c;
}

GptConfig parse_gpt2(const Json& json, std::string_view source) {
  const ConfigReader r(json, source);
  GptConfig c;
  c.vocab_size = r.integer("vocab_size");
  c.block_size = r.integer("n_positions");
  c.n_embd = r.integer("n_embd");
  c.n_layer = r.integer("n_layer");
  c.n_head = r.integer("n_head");
  c.dropout = 0.0;
  c.bias = true;
  TESSEL_CHECK(r.integer("n_inner", 4 * c.n_embd) == 4 * c.n_embd, InvalidArgument,
               "{}: \"n_inner\" {} is not supported (tessel's GPT MLP is 4 * n_embd = {})", source,
               r.integer("n_inner", 0), 4 * c.n_embd);
  const std::string act = r.string("activation_function", "gelu_new");
  TESSEL_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", InvalidArgument,
               "{}: \"activation_function\" is \"{}\"; tessel's GPT uses GELU with the tanh "
               "approximation (\"gelu_new\")",
               source, act);
  const double eps = r.number("layer_norm_epsilon", 1e-5);
  TESSEL_CHECK(std::abs(eps - 1e-5) <= 1e-12, InvalidArgument,
               "{}: \"layer_norm_epsilon\" {} is not supported (tessel's GPT uses 1e-5)", source,
               eps);
  TESSEL_CHECK(r.boolean("scale_attn_weights", true), InvalidArgument,
               "{}: \"scale_attn_weights\": false is not supported", source);
  r.expect_false("scale_attn_by_inverse_layer_idx");
  r.expect_false("add_cross_attention");
  TESSEL_CHECK(r.boolean("tie_word_embeddings", true), InvalidArgument,
               "{}: \"tie_word_embeddings\": false is not supported (tessel's GPT ties its LM "
               "head to the token embedding)",
               source);
  return c;
}

// --- Names ---------------------------------------------------------------------------------

bool is_conv1d_weight(std::string_view name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

// The architecture of a tessel model; InvalidArgument for another kind of module.
HfArchitecture architecture_of(const Module& model) {
  if (dynamic_cast<const Llama*>(&model) != nullptr) return HfArchitecture::kLlama;
  if (dynamic_cast<const GPT*>(&model) != nullptr) return HfArchitecture::kGpt2;
  throw InvalidArgument(fmt::format(
      "Hugging Face format: a {} is neither an nn::Llama (LlamaForCausalLM) nor an nn::GPT "
      "(GPT2LMHeadModel)",
      model.type_name()));
}

// Buffers older transformers versions saved beside the weights, which no model here has.
bool is_ignored_buffer(HfArchitecture arch, std::string_view name) {
  if (arch == HfArchitecture::kGpt2) {
    return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
  }
  return ends_with(name, ".rotary_emb.inv_freq");
}

// --- Reading a folder ----------------------------------------------------------------------

struct Located {
  std::string path;
  SafetensorsEntry entry;
};

// Every tensor of the folder's weight files, by name, from their headers only.
std::map<std::string, Located> index_folder(const std::string& dir) {
  const fs::path root(dir);
  std::map<std::string, Located> found;
  if (fs::exists(root / kSingleFile)) {
    const std::string path = (root / kSingleFile).string();
    for (auto& [name, entry] : read_safetensors_index(path).entries) found[name] = {path, entry};
    return found;
  }
  const std::string index_path = (root / kIndexFile).string();
  TESSEL_CHECK(fs::exists(index_path), IoError, "{}: neither {} nor {} exists", dir, kSingleFile,
               kIndexFile);
  Json index;
  try {
    index = Json::parse(read_text(index_path));
  } catch (const Json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON: {}", index_path, e.what()));
  }
  TESSEL_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
               InvalidArgument, "{}: missing the \"weight_map\" object", index_path);
  std::map<std::string, SafetensorsIndex> headers;  // by file name
  std::vector<std::string> problems;
  for (const auto& [name, file_json] : index["weight_map"].items()) {
    TESSEL_CHECK(file_json.is_string(), InvalidArgument,
                 "{}: weight_map entry \"{}\" must name a file, got {}", index_path, name,
                 file_json.dump());
    const std::string file = file_json.get<std::string>();
    TESSEL_CHECK(!file.empty() && file.find('/') == std::string::npos &&
                     file.find('\\') == std::string::npos && file != "." && file != "..",
                 InvalidArgument, "{}: weight_map entry \"{}\" names \"{}\", a file outside {}",
                 index_path, name, file, dir);
    const std::string path = (root / file).string();
    if (!headers.count(file)) headers.emplace(file, read_safetensors_index(path));
    const auto& entries = headers.at(file).entries;
    auto it = entries.find(name);
    if (it == entries.end()) {
      problems.push_back(fmt::format("{} (listed in {}, absent there)", name, file));
      continue;
    }
    found[name] = {path, it->second};
  }
  TESSEL_CHECK(problems.empty(), InvalidArgument, "{}: {}", index_path, join(problems));
  return found;
}

// Reads `box` (per-dimension offset and sizes) of a tensor: the box's rows are contiguous runs
// of the file from the innermost dimension the box cuts on, each read with one seek, so a
// shard reads its own bytes and nothing else. Adds the bytes read to *bytes_read.
Tensor read_box(const Located& at, const Shape& offset, const Shape& sizes, uint64_t* bytes_read) {
  const SafetensorsEntry& e = at.entry;
  Tensor t = empty(sizes, e.dtype, Device::cpu());
  if (t.numel() == 0) return t;
  const int64_t n = static_cast<int64_t>(sizes.size());
  // cut: the innermost dimension the box does not cover whole; dims after it are whole.
  int64_t cut = 0;
  for (int64_t d = n - 1; d >= 0; --d) {
    if (sizes[d] != e.shape[d]) {
      cut = d;
      break;
    }
  }
  const uint64_t elem = dtype_size(e.dtype);
  int64_t inner = 1;  // elements of one step of dimension `cut` in the file
  for (int64_t d = cut + 1; d < n; ++d) inner *= e.shape[d];
  const uint64_t run_bytes = n == 0 ? elem : static_cast<uint64_t>(sizes[cut] * inner) * elem;
  std::ifstream in(at.path, std::ios::binary);
  char* out = static_cast<char*>(t.data_ptr());
  std::vector<int64_t> index(static_cast<size_t>(cut), 0);  // over the box's dims before `cut`
  while (true) {
    int64_t first = 0;  // the run's first element in the file, row-major
    for (int64_t d = 0; d < n; ++d) {
      const int64_t i = d < cut ? index[d] + offset[d] : d == cut ? offset[d] : 0;
      first = first * e.shape[d] + i;
    }
    in.seekg(static_cast<std::streamoff>(e.begin + static_cast<uint64_t>(first) * elem));
    in.read(out, static_cast<std::streamsize>(run_bytes));
    TESSEL_CHECK(in.good(), IoError, "{}: cannot read tensor \"{}\" (bytes {}..{})", at.path,
                 e.name, e.begin, e.end);
    out += run_bytes;
    *bytes_read += run_bytes;
    int64_t d = cut - 1;  // next index, last dimension fastest
    while (d >= 0 && ++index[d] == sizes[d]) index[d--] = 0;
    if (d < 0) break;
  }
  return t;
}

Tensor read_entry(const Located& at) {
  uint64_t ignored = 0;
  return read_box(at, Shape(at.entry.shape.size(), 0), at.entry.shape, &ignored);
}

bool is_float_weight(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const Tensor x = contiguous(to(a, DType::kF32)), y = contiguous(to(b, DType::kF32));
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// --- Writing -------------------------------------------------------------------------------

Json llama_config_json(const LlamaConfig& c, DType dtype) {
  Json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.ffn_hidden();
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.kv_heads();
  j["head_dim"] = c.head_size();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_seq_len;
  j["initializer_range"] = c.initializer_range;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling->factor},
        {"low_freq_factor", c.rope_scaling->low_freq_factor},
        {"high_freq_factor", c.rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype_name(dtype);
  return j;
}

Json gpt2_config_json(const GptConfig& c, DType dtype) {
  TESSEL_CHECK(c.bias, InvalidArgument,
               "Hugging Face GPT-2 has biases in every Linear and LayerNorm; this GPT was built "
               "with bias = false");
  Json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.block_size;
  j["n_ctx"] = c.block_size;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_inner"] = nullptr;
  j["activation_function"] = "gelu_new";
  j["resid_pdrop"] = c.dropout;
  j["embd_pdrop"] = c.dropout;
  j["attn_pdrop"] = c.dropout;
  j["layer_norm_epsilon"] = 1e-5;
  j["initializer_range"] = 0.02;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = true;
  j["bos_token_id"] = c.vocab_size - 1;  // GPT-2's <|endoftext|>, the last token
  j["eos_token_id"] = c.vocab_size - 1;
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype_name(dtype);
  return j;
}

}  // namespace

std::string_view hf_architecture_name(HfArchitecture architecture) {
  return architecture == HfArchitecture::kLlama ? "LlamaForCausalLM" : "GPT2LMHeadModel";
}

HfConfig parse_hf_config(std::string_view json_text, std::string_view source) {
  Json json;
  try {
    json = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  TESSEL_CHECK(json.is_object(), InvalidArgument, "{}: expected a JSON object", source);
  // "architectures" names the class; "model_type" alone is enough for the base names.
  std::string arch;
  if (json.contains("architectures") && json["architectures"].is_array() &&
      !json["architectures"].empty() && json["architectures"][0].is_string()) {
    arch = json["architectures"][0].get<std::string>();
  } else if (json.contains("model_type") && json["model_type"].is_string()) {
    const std::string type = json["model_type"].get<std::string>();
    arch = type == "llama" ? "LlamaForCausalLM" : type == "gpt2" ? "GPT2LMHeadModel" : type;
  }
  HfConfig config;
  if (arch == "LlamaForCausalLM") {
    config.architecture = HfArchitecture::kLlama;
    config.llama = parse_llama(json, source);
  } else if (arch == "GPT2LMHeadModel") {
    config.architecture = HfArchitecture::kGpt2;
    config.gpt = parse_gpt2(json, source);
  } else {
    throw InvalidArgument(fmt::format(
        "{}: unknown architecture \"{}\" (supported: LlamaForCausalLM, GPT2LMHeadModel)", source,
        arch.empty() ? "(no \"architectures\" or \"model_type\")" : arch));
  }
  config.dtype = parse_torch_dtype(ConfigReader(json, source), source);
  return config;
}

HfConfig read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  return parse_hf_config(read_text(path), path);
}

HfModel load_hf_model(const std::string& dir, DType dtype, Device device) {
  TESSEL_CHECK(is_float_weight(dtype), InvalidArgument,
               "load_hf_model: dtype must be f32, bf16 or f16, got {}", dtype_name(dtype));
  HfModel hf;
  hf.config = read_hf_config(dir);
  {
    DefaultDeviceGuard meta(Device::meta());  // shapes only: the weights come from the folder
    if (hf.config.architecture == HfArchitecture::kLlama) {
      hf.model = std::make_shared<Llama>(hf.config.llama);
    } else {
      hf.model = std::make_shared<GPT>(hf.config.gpt);
    }
  }
  hf.model->to_empty(device);
  if (dtype != DType::kF32) hf.model->to(dtype);
  load_hf_weights(*hf.model, dir);
  return hf;
}

HfLoadStats load_hf_weights(Module& model, const std::string& dir) {
  const HfArchitecture arch = architecture_of(model);
  const HfConfig config = read_hf_config(dir);
  TESSEL_CHECK(config.architecture == arch, InvalidArgument,
               "{}: the folder holds a {}, the model is a {}", dir,
               hf_architecture_name(config.architecture), hf_architecture_name(arch));
  std::map<std::string, Located> available = index_folder(dir);

  // GPT-2 checkpoints saved from the base model lack the "transformer." prefix.
  std::string prefix;
  if (arch == HfArchitecture::kGpt2 && !available.count("transformer.wte.weight") &&
      available.count("wte.weight")) {
    prefix = "transformer.";
  }
  auto hf_name = [&](const std::string& ours) {
    return starts_with(ours, prefix) ? ours.substr(prefix.size()) : ours;
  };

  // Read every tensor into a temporary of the parameter's dtype, collecting every problem.
  StateDict loaded;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> used;
  HfLoadStats stats;
  const StateDict targets = model.state_dict();
  for (const auto& [name, dst] : targets) {
    const std::string key = hf_name(name);
    auto it = available.find(key);
    if (it == available.end()) {
      missing.push_back(key);
      continue;
    }
    used.insert(key);
    const SafetensorsEntry& e = it->second.entry;
    const bool transposed = arch == HfArchitecture::kGpt2 && is_conv1d_weight(name);
    // Our layout of the file's tensor: GPT-2's Conv1D (in, out) is (out, in) here.
    Shape ours = e.shape;
    if (transposed && ours.size() == 2) std::swap(ours[0], ours[1]);
    // A shard (FSDP, tensor parallelism) reads only its box of the whole tensor. Tensor
    // parallelism may view a fused weight by sections (c_attn's (3C, C) as (3, C, C)): global
    // (k, n / k, ...) of ours (n, ...).
    const ShardInfo* shard = dst.shard_info();
    const Shape global = shard != nullptr ? shard->global_shape : dst.shape();
    const bool sections = global.size() == ours.size() + 1 && !ours.empty() && global[0] > 0 &&
                          global[0] * global[1] == ours[0] &&
                          std::equal(global.begin() + 2, global.end(), ours.begin() + 1);
    if (!is_float_weight(e.dtype) || (global != ours && !sections)) {
      Shape expected = global;
      if (transposed && expected.size() == 2) std::swap(expected[0], expected[1]);
      mismatched.push_back(fmt::format("{} (expected {} float{}, got {} {})", key,
                                       shape_str(expected),
                                       transposed ? ", GPT-2 Conv1D (in, out)" : "",
                                       shape_str(e.shape), safetensors_dtype_name(e.dtype)));
      continue;
    }
    // Reads the box (offset, sizes) of our layout, in dst's dtype.
    auto read_ours = [&](Shape offset, Shape sizes) {
      if (transposed) {
        std::swap(offset[0], offset[1]);
        std::swap(sizes[0], sizes[1]);
      }
      Tensor t = to(read_box(it->second, offset, sizes, &stats.bytes_read), dst.dtype());
      return transposed ? contiguous(transpose(t, 0, 1)) : t;
    };
    const Shape offset = shard != nullptr ? shard->offset : Shape(global.size(), 0);
    const Shape& sizes = dst.shape();
    Tensor t;
    if (!sections) {
      t = read_ours(offset, sizes);
    } else {
      // One box of ours per section in the shard, stacked back into the sections' view.
      std::vector<Tensor> parts;
      for (int64_t a = offset[0]; a < offset[0] + sizes[0]; ++a) {
        Shape o(offset.begin() + 1, offset.end()), z(sizes.begin() + 1, sizes.end());
        o[0] += a * global[1];
        parts.push_back(read_ours(o, z));
      }
      t = parts.empty() ? empty(sizes, dst.dtype(), Device::cpu()) : stack(parts, 0);
    }
    stats.bytes_in_files += e.end - e.begin;
    loaded.emplace(name, std::move(t));
  }

  // A tied LM head may be stored anyway; it must then be the embedding.
  const bool tied = arch == HfArchitecture::kGpt2 || config.llama.tie_word_embeddings;
  const std::string embedding = arch == HfArchitecture::kGpt2 ? hf_name("transformer.wte.weight")
                                                              : "model.embed_tokens.weight";
  std::vector<std::string> unexpected;
  for (const auto& [key, at] : available) {
    if (used.count(key) || is_ignored_buffer(arch, key)) continue;
    if (tied && key == "lm_head.weight" && available.count(embedding)) {
      if (same_values(read_entry(at), read_entry(available.at(embedding)))) continue;
      mismatched.push_back("lm_head.weight (the model ties it to " + embedding +
                           ", but the values differ)");
      continue;
    }
    unexpected.push_back(key);
  }

  std::string problems;
  if (!missing.empty()) problems += "; missing tensors: " + join(missing);
  if (!unexpected.empty()) problems += "; unexpected tensors: " + join(unexpected);
  if (!mismatched.empty()) problems += "; mismatched: " + join(mismatched);
  TESSEL_CHECK(problems.empty(), InvalidArgument, "{}: {} weights do not fit the model: {}", dir,
               hf_architecture_name(arch), problems.substr(2));
  model.load_state_dict(loaded);  // commit: every temporary is checked and in hand
  return stats;
}

void save_hf(const Module& model, const std::string& dir, const HfSaveOptions& options) {
  const HfArchitecture arch = architecture_of(model);
  const StateDict state = model.state_dict();
  TESSEL_CHECK(!state.empty(), InvalidArgument, "save_hf: the model has no parameters");
  const DType dtype = options.dtype.value_or(state.begin()->second.dtype());
  TESSEL_CHECK(is_float_weight(dtype), InvalidArgument,
               "save_hf: weights are saved as f32, bf16 or f16, not {}", dtype_name(dtype));
  const Json config = arch == HfArchitecture::kLlama
                          ? llama_config_json(dynamic_cast<const Llama&>(model).config(), dtype)
                          : gpt2_config_json(dynamic_cast<const GPT&>(model).config(), dtype);

  // Hugging Face layout: CPU, the saved dtype, Conv1D weights (in, out).
  TensorMap tensors;
  uint64_t total = 0;
  for (const auto& [name, t] : state) {
    TESSEL_CHECK(t.shard_info() == nullptr, InvalidArgument,
                 "save_hf: parameter '{}' is a shard ({} of {}); gather the whole state dict "
                 "(full_state_dict) into an unsharded model first",
                 name, shape_str(t.shape()), shape_str(t.shard_info()->global_shape));
    Tensor out = to(to(t, Device::cpu()), dtype);
    if (arch == HfArchitecture::kGpt2 && is_conv1d_weight(name)) {
      out = contiguous(transpose(out, 0, 1));
    }
    total += out.nbytes();
    tensors.emplace(name, std::move(out));
  }

  fs::create_directories(dir);
  const fs::path root(dir);
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  write_text((root / "config.json").string(), config.dump(2) + "\n");
  // A stale file of the other layout would shadow or contradict this one.
  if (total <= options.max_shard_bytes) {
    fs::remove(root / kIndexFile);
    save_safetensors((root / kSingleFile).string(), tensors, metadata);
    return;
  }
  fs::remove(root / kSingleFile);
  // Shards in name order, each closed before it would pass the limit.
  std::vector<TensorMap> shards(1);
  uint64_t shard_bytes = 0;
  for (const auto& [name, t] : tensors) {
    if (shard_bytes > 0 && shard_bytes + t.nbytes() > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace(name, t);
    shard_bytes += t.nbytes();
  }
  Json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file =
        fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    save_safetensors((root / file).string(), shards[i], metadata);
    for (const auto& [name, t] : shards[i]) index["weight_map"][name] = file;
  }
  write_text((root / kIndexFile).string(), index.dump(2) + "\n");
}

}  // namespace tessel::nn
