#include "tessel/parallel/checkpoint/hf_export.h"

#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string_view>

#include "tessel/base/error.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/llama.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/tensor/device.h"
#include "tessel/tensor/safetensors.h"

namespace tessel::checkpoint {
namespace {

namespace fs = std::filesystem;

// Removes a file when it goes out of scope (the consolidated temporary).
class RemoveOnExit {
 public:
  explicit RemoveOnExit(fs::path path) : path_(std::move(path)) {}
  ~RemoveOnExit() {
    std::error_code ignored;
    fs::remove(path_, ignored);
  }
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;

 private:
  fs::path path_;
};

const Tensor& tensor_named(const TensorMap& tensors, const std::string& name,
                           const std::string& dir) {
  auto it = tensors.find(name);
  TESSEL_CHECK(it != tensors.end() && it->second.dim() == 2, InvalidArgument,
               "export_hf: {} has no 2-D tensor \"{}\" to read a GPT's shapes from", dir, name);
  return it->second;
}

nn::GptConfig infer_gpt(const TensorMap& tensors, int64_t heads, const std::string& dir) {
  TESSEL_CHECK(heads > 0, InvalidArgument,
               "export_hf: give the model's Hugging Face config or, for a GPT, its number of "
               "heads (the checkpoint's shapes do not tell it)");
  const Tensor& wte = tensor_named(tensors, "transformer.wte.weight", dir);
  const Tensor& wpe = tensor_named(tensors, "transformer.wpe.weight", dir);
  int64_t layers = 0;
  while (tensors.count(fmt::format("transformer.h.{}.ln_1.weight", layers))) ++layers;
  return nn::GptConfig{.vocab_size = wte.size(0),
                       .block_size = wpe.size(0),
                       .n_layer = layers,
                       .n_head = heads,
                       .n_embd = wte.size(1)};
}

}  // namespace

int64_t export_hf(const std::string& dir, const std::string& out, const HfExportOptions& options) {
  TESSEL_CHECK(options.config.has_value() || options.gpt_heads > 0, InvalidArgument,
               "export_hf: give the model's Hugging Face config or, for a GPT, its number of "
               "heads (the checkpoint's shapes do not tell it)");
  fs::create_directories(out);
  const fs::path tmp = fs::path(out) / ".tessel-export-hf.safetensors";
  TensorMap tensors;
  {
    RemoveOnExit remove(tmp);
    consolidate(dir, tmp.string(), options.prefix);
    tensors = load_safetensors(tmp.string()).tensors;
  }
  std::shared_ptr<nn::Module> model;
  {
    DefaultDeviceGuard meta(Device::meta());  // the checkpoint's values replace every one
    if (options.config && options.config->architecture == nn::HfArchitecture::kLlama) {
      model = std::make_shared<nn::Llama>(options.config->llama);
    } else {
      model = std::make_shared<nn::GPT>(
          options.config ? options.config->gpt : infer_gpt(tensors, options.gpt_heads, dir));
    }
  }
  model->to_empty(Device::cpu());
  if (!tensors.empty()) model->to(tensors.begin()->second.dtype());
  model->load_state_dict(tensors);
  nn::save_hf(*model, out, options.save);
  return static_cast<int64_t>(tensors.size());
}

}  // namespace tessel::checkpoint
