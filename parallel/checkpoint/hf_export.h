#pragma once
// Hugging Face folders from distributed checkpoints (tessel-ckpt export-hf): the model's tensors
// of a checkpoint assembled into a whole nn::Llama or nn::GPT and written by nn::save_hf, so
// transformers loads the trained model unchanged.
//
//   checkpoint::export_hf("ckpt/step_1000", "hf_out/", {.gpt_heads = 4});   // a GPT
//   checkpoint::export_hf("ckpt/", "hf_out/", {.config = nn::read_hf_config("base/")});

#include <cstdint>
#include <optional>
#include <string>

#include "tessel/nn/hf_format.h"

namespace tessel::checkpoint {

struct HfExportOptions {
  std::string prefix = "model.";       // the model's tensors in the checkpoint, as consolidate
  std::optional<nn::HfConfig> config;  // the shapes; none: a GPT inferred from the tensors
  int64_t gpt_heads = 0;               // for the inferred GPT (shapes do not tell the heads)
  nn::HfSaveOptions save;              // shard size and saved dtype
};

// Reads the tensors of the checkpoint at `dir` (a checkpoint folder, or a root: its latest)
// whose names start with options.prefix, puts them into the model options.config describes (or
// a GPT whose vocabulary, block size, width and depth are read off transformer.wte, wpe and
// h.N, with options.gpt_heads heads), and writes it to `out` with nn::save_hf. One process;
// the whole model is held in memory. Returns the number of tensors written. Throws
// InvalidArgument naming the problem: neither a config nor gpt_heads, tensors that do not fit
// the model (missing, unexpected, mismatched, as Module::load_state_dict), or as consolidate
// and save_hf do.
int64_t export_hf(const std::string& dir, const std::string& out, const HfExportOptions& options);

}  // namespace tessel::checkpoint
