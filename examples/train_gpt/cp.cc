#include "cp.h"

#include "tessel/base/error.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/llama.h"
#include "tessel/parallel/cp/gpt_cp.h"
#include "tessel/parallel/cp/llama_cp.h"

namespace tessel::train_gpt {

void add_cp_flags(CLI::App& app, Flags& f) {
  app.add_option("--cp", f.cp,
                 "context-parallel ranks: every sequence split over them (ring attention; FSDP "
                 "over dp_shard x cp)")
      ->check(CLI::PositiveNumber);
}

void check_cp_flags(const Flags& f) {
  if (f.cp == 1) return;
  TESSEL_CHECK(f.model == "gpt" || f.model == "llama", InvalidArgument,
               "--cp {} runs the attention as ring attention: it needs --model gpt or llama, not "
               "{}",
               f.cp, f.model);
  TESSEL_CHECK(!f.ddp && f.ep == 1 && !f.sequence_parallel && f.init_hf.empty(), InvalidArgument,
               "--cp {} goes with FSDP (and --tp): drop --ddp, --ep, --sequence-parallel and "
               "--init-hf",
               f.cp);
  TESSEL_CHECK(f.seq % (2 * f.cp) == 0, InvalidArgument,
               "--cp {} cuts each sequence into 2 x {} equal chunks: make --seq {} a multiple of "
               "{}",
               f.cp, f.cp, f.seq, 2 * f.cp);
}

void apply_cp(nn::Module& model, const Flags& f, const Layout& l) {
  if (l.cp == 1) return;
  const parallel::CpLayout layout = parallel::cp_layout_load_balanced(f.seq, l.cp);
  if (auto* llama = dynamic_cast<nn::Llama*>(&model)) {
    parallel::apply_llama_context_parallel(*llama, l.mesh->group("cp"), layout);
  } else {
    parallel::apply_gpt_context_parallel(dynamic_cast<nn::GPT&>(model), l.mesh->group("cp"),
                                         layout);
  }
}

DeviceMesh fsdp_mesh(const Layout& l) {
  if (l.cp == 1) {
    return l.replicate > 1 ? l.mesh->slice({"dp_replicate", "dp_shard"}) : (*l.mesh)["dp_shard"];
  }
  const DeviceMesh folded = l.mesh->flatten({"dp_shard", "cp"}, "dp_shard_cp");
  return l.replicate > 1 ? folded.slice({"dp_replicate", "dp_shard_cp"}) : folded["dp_shard_cp"];
}

std::pair<Tensor, Tensor> cp_slice(const Tensor& x, const Tensor& y, const Flags& f,
                                   const Layout& l) {
  if (l.cp == 1) return {x, y};
  const parallel::CpBatch b = parallel::cp_shard_batch(
      x, y, parallel::cp_layout_load_balanced(f.seq, l.cp), l.mesh->local_rank("cp"));
  return {b.tokens, b.targets};
}

}  // namespace tessel::train_gpt
