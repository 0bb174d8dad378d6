#include "generate.h"

#include <fmt/format.h>

#include <cstdio>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/nn/generate.h"
#include "tessel/parallel/fsdp/state_dict.h"

namespace tessel::train_gpt {

std::string generate_text(nn::Module& model, int64_t context, const Flags& f, int64_t n) {
  std::vector<int64_t> prompt;
  for (unsigned char c : f.prompt) prompt.push_back(c);
  const std::vector<int64_t> bytes = nn::generate(
      model, prompt, context,
      {.max_new_tokens = n, .temperature = f.temperature, .top_k = f.top_k, .seed = f.seed});
  std::string text;
  for (const int64_t b : bytes) text += static_cast<char>(b);
  return text;
}

int generate_from_checkpoint(const Flags& f, const ModelSpec& spec, nn::Module& model,
                             const std::string& loaded, const checkpoint::CheckpointState& state,
                             bool lead) {
  TESSEL_CHECK(!loaded.empty(), InvalidArgument,
               "--generate: no committed checkpoint under --checkpoint-dir '{}': expected one "
               "saved by a run with --checkpoint-every",
               f.checkpoint_dir);
  // A checkpoint of a larger model would load into a smaller one (it may hold more tensors).
  if (const auto saved = state.metadata.find("model.config"); saved != state.metadata.end()) {
    TESSEL_CHECK(saved->second == model_config_str(f), InvalidArgument,
                 "--generate: {} holds a model of {}, but the flags give {}: pass the training "
                 "run's --layers, --heads, --embd and --seq",
                 loaded, saved->second, model_config_str(f));
  }
  std::unique_ptr<nn::Module> whole = spec.make();
  {
    const nn::StateDict state = full_state_dict(model);
    if (!lead) return 0;
    whole->load_state_dict(state);
  }
  fmt::print(stderr, "train_gpt: {} bytes from {} (step {}), temperature {}, top-k {}, seed {}\n",
             f.max_new_tokens, loaded, state.step, f.temperature, f.top_k, f.seed);
  fmt::print("{}{}\n", f.prompt, generate_text(*whole, spec.context(), f, f.max_new_tokens));
  return 0;
}

}  // namespace tessel::train_gpt
