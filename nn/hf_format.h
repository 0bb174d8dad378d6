#pragma once
// Hugging Face model folders, both ways, for LlamaForCausalLM (nn::Llama) and GPT2LMHeadModel
// (nn::GPT): config.json plus model.safetensors, or shards listed by
// model.safetensors.index.json. A model sharded by FSDP or tensor parallelism loads too: each
// parameter reads only the bytes of its own box (Tensor::shard_info), so each rank reads its
// shards and not the whole model.
//
//   nn::HfModel hf = nn::load_hf_model("Llama-3.2-1B/");         // config sets the shapes
//   Tensor logits = (*hf.model)(tokens);
//   nn::save_hf(*hf.model, "out/");                               // transformers loads it
//   nn::load_hf_weights(model, "out/");                           // into an existing model
//
// Names: Llama's are Hugging Face's already; GPT's too, except that GPT-2's Conv1D weights
// (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are stored (in, out) there and (out, in)
// here, so they are transposed on the way in and out. Functions are thread-safe (no shared
// state); the model is used by the calling thread only.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tessel/nn/gpt.h"
#include "tessel/nn/llama.h"
#include "tessel/nn/module.h"

namespace tessel::nn {

enum class HfArchitecture { kLlama, kGpt2 };

// "LlamaForCausalLM", "GPT2LMHeadModel": config.json's "architectures" entry.
std::string_view hf_architecture_name(HfArchitecture architecture);

// What a config.json describes, in tessel's terms.
struct HfConfig {
  HfArchitecture architecture = HfArchitecture::kLlama;
  LlamaConfig llama;           // for kLlama
  GptConfig gpt;               // for kGpt2 (dropout 0: inference and fine-tuning set their own)
  std::optional<DType> dtype;  // "torch_dtype" (or "dtype"), when present
};

// Parses a config.json's text; `source` names it in messages. Throws InvalidArgument naming the
// key for an unknown architecture, a missing or ill-typed key, or a setting tessel's model
// does not implement (biases in Llama, rope types other than llama3, GPT-2 activations other
// than gelu_new, untied GPT-2, ...).
HfConfig parse_hf_config(std::string_view json_text, std::string_view source);
// parse_hf_config of `dir`/config.json; IoError when it cannot be read.
HfConfig read_hf_config(const std::string& dir);

struct HfModel {
  HfConfig config;
  std::shared_ptr<Module> model;  // an nn::Llama or nn::GPT
};

// Builds the model `dir`/config.json describes (parameters in `dtype` on `device`; the model
// is built on the meta device first, so no memory goes to an initialisation that is then
// overwritten) and loads the folder's weights into it, as load_hf_weights. Throws as
// read_hf_config and load_hf_weights.
HfModel load_hf_model(const std::string& dir, DType dtype = DType::kF32,
                      Device device = Device::cpu());

// What load_hf_weights read.
struct HfLoadStats {
  uint64_t bytes_read = 0;      // tensor bytes read from the files (headers excluded)
  uint64_t bytes_in_files = 0;  // the whole tensors' bytes in the files, for comparison
};

// Loads the weights of `dir` into `model` (an nn::Llama or nn::GPT), converting bf16, f16 and
// f32 to each parameter's dtype. A parameter that is a shard (Tensor::shard_info: FSDP, tensor
// parallelism) receives its box of the whole tensor, and only the box's bytes are read, in
// contiguous runs; a whole shape that views a fused weight by sections (tensor parallelism's
// c_attn, (3C, C) as (3, C, C)) reads one box per section. Every tensor is read into a temporary
// first; the model is changed only when all of them were found and fit, so a failed load leaves it
// as it was. Parameters must have memory (to_empty() a model built on the meta device first).
// Throws InvalidArgument listing every problem by tensor name: an architecture other than the
// model's, missing tensors, unexpected tensors, shapes other than the model's (whole shapes, for
// shards), non-float dtypes, an index that names a file outside `dir` or a tensor its file lacks;
// IoError when a file cannot be read. Ignored: buffers old transformers versions saved (GPT-2's
// attn.bias and attn.masked_bias, Llama's rotary_emb.inv_freq), and lm_head.weight of a tied model
// when it equals the embedding (both read whole to compare).
HfLoadStats load_hf_weights(Module& model, const std::string& dir);

struct HfSaveOptions {
  // Above this many bytes of tensors, the weights go to model-0000i-of-0000n.safetensors files
  // (each at most this big, unless one tensor alone is bigger) listed by
  // model.safetensors.index.json; at or below it, to one model.safetensors. transformers'
  // default, 5 GB.
  uint64_t max_shard_bytes = 5'000'000'000;
  std::optional<DType> dtype;  // the saved dtype (f32, bf16, f16); none: each parameter's own
};

// Writes `model` (an nn::Llama or nn::GPT) to `dir` (created if needed) as config.json (the
// fields transformers needs, torch_dtype the saved dtype) and safetensors with
// {"format": "pt"} metadata, so transformers' from_pretrained loads it unchanged. A tied LM
// head is not written (transformers ties it again). Replaces files of the same names; leaves
// other files. Throws InvalidArgument for another kind of module, a sharded parameter (save a
// whole model: full_state_dict gathers one), a GPT without biases (GPT-2 has them), a
// non-float dtype; IoError when a file cannot be written.
void save_hf(const Module& model, const std::string& dir, const HfSaveOptions& options = {});

}  // namespace tessel::nn
