// Text from a model: the sample at the end of training and --generate from a checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "flags.h"
#include "model.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/checkpoint/checkpoint.h"

namespace tessel::train_gpt {

// --prompt continued by `n` bytes of `model` (nn::generate with --temperature, --top-k, --seed)
// over `context` positions.
std::string generate_text(nn::Module& model, int64_t context, const Flags& f, int64_t n);

// --generate: the model of the checkpoint `loaded` (gathered on rank 0 when sharded: every rank
// calls this) continues --prompt; the text goes to stdout, what produced it to stderr.
int generate_from_checkpoint(const Flags& f, const ModelSpec& spec, nn::Module& model,
                             const std::string& loaded, const checkpoint::CheckpointState& state,
                             bool lead);

}  // namespace tessel::train_gpt
