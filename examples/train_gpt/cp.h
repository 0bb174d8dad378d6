// train_gpt's context parallelism: --cp N splits every sequence over N ranks (the GPT's or the
// Llama's attention as ring attention over the mesh's cp dimension, load-balanced causal slices,
// global positions), with FSDP over dp_shard and cp flattened.
#pragma once

#include <utility>

#include "flags.h"
#include "layout.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/module.h"
#include "tessel/tensor/tensor.h"

namespace tessel::train_gpt {

// --cp.
void add_cp_flags(CLI::App& app, Flags& f);

// --cp's checks that need no mesh: --model gpt or llama, no --ddp, --ep, --sequence-parallel or
// --init-hf, --seq a multiple of 2 x cp (equal load-balanced slices). Throws InvalidArgument
// naming the flag.
void check_cp_flags(const Flags& f);

// With --cp > 1: the GPT's or the Llama's attention over the cp group (call before TP and FSDP, on
// the meta-device model).
void apply_cp(nn::Module& model, const Flags& f, const Layout& l);

// The mesh FSDP shards over: dp_shard (and dp_replicate for HSDP), with cp folded into
// dp_shard when --cp > 1.
DeviceMesh fsdp_mesh(const Layout& l);

// This rank's slice of the sequences of its rows (x, y) (B, seq) under --cp; unchanged at cp 1.
std::pair<Tensor, Tensor> cp_slice(const Tensor& x, const Tensor& y, const Flags& f,
                                   const Layout& l);

}  // namespace tessel::train_gpt
