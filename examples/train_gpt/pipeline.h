// train_gpt --pp N: the GPT or the Llama split into pipeline stages over N ranks
// (tessel/parallel/pp), with data parallelism over the remaining ranks inside each stage (FSDP
// over dp_shard = world / (N x tp); HSDP with --dp-replicate; DDP with --ddp) and, for the GPT,
// tensor parallelism over --tp, trained by the pipeline runtime.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "flags.h"

namespace tessel::train_gpt {

struct PipelineFlags {
  int64_t pp = 1;                  // pipeline ranks (1: no pipeline)
  std::string schedule = "1f1b";   // gpipe, 1f1b, interleaved-1f1b, zero-bubble
  int64_t microbatches = 0;        // per step (0: 2 x --pp)
  int64_t virtual_stages = 0;      // per rank (0: 2 for interleaved-1f1b, else 1)
  std::string layout = "uniform";  // uniform, balanced, or block counts per stage "2,1,1,2"
};

// Registers --pp, --pp-schedule, --microbatches, --pp-virtual-stages and --pp-layout.
void add_pipeline_flags(CLI::App& app, PipelineFlags& p);

// With --pp > 1: the flags the pipeline does not support yet, and sizes that cannot work, each
// named with what would. Throws InvalidArgument.
void check_pipeline_flags(const Flags& f, const PipelineFlags& p);

// Trains as the flags say with the model pipelined over --pp ranks; every rank calls it.
// Returns the exit status.
int run_pipeline(const Flags& f, const PipelineFlags& p);

}  // namespace tessel::train_gpt
