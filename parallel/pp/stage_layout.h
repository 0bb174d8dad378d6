#pragma once
// Layer layouts of a pipeline: how many transformer blocks each of S stages holds, stage 0
// first. The embedding always sits on stage 0 and the head (final norm, LM head, loss) on stage
// S−1, so a layout is S block counts that sum to the model's block count; a count may be 0 (a
// stage with only the embedding, only the head, or nothing).
//
//   pp::uniform_layout(6, 4);                        // {2, 2, 1, 1}
//   pp::parse_layout("1,2,2,1", 6, 4);               // {1, 2, 2, 1}
//   pp::balanced_layout(pp::gpt_layer_costs(cfg, T), 4);  // by a per-layer cost profile
//
// Pure functions of their arguments: every rank computes the same layout from the same inputs.

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/nn/gpt.h"

namespace tessel::pp {

// num_blocks spread as evenly as counts allow; the first num_blocks % num_stages stages get one
// more. Throws InvalidArgument for num_blocks < 0 or num_stages < 1.
std::vector<int> uniform_layout(int num_blocks, int num_stages);

// A user's layout, "2,3,3,2" (block counts per stage, comma-separated). Throws InvalidArgument
// naming the text and the problem when it does not hold num_stages non-negative counts summing to
// num_blocks.
std::vector<int> parse_layout(std::string_view text, int num_blocks, int num_stages);

// Checks a layout as parse_layout does (InvalidArgument naming the layout and the problem).
void check_layout(const std::vector<int>& layout, int num_blocks, int num_stages);

// "2,3,3,2".
std::string format_layout(const std::vector<int>& layout);

// Balances a per-layer cost profile: costs = {embedding, block 0, ..., block L−1, head} (time,
// memory, or a weighted sum of both; any non-negative numbers). Returns the layout of L blocks
// over num_stages stages whose most expensive stage (its blocks, plus the embedding on stage 0
// and the head on the last) is cheapest; among equals, the one that puts blocks earliest. Throws
// InvalidArgument for fewer than 2 costs, a negative or non-finite cost, or num_stages < 1.
std::vector<int> balanced_layout(std::span<const double> costs, int num_stages);

// A deterministic cost profile of a GPT for balanced_layout: the forward+backward
// multiply-accumulates per token of the embedding (a gather: counted as n_embd), each block
// (attention and MLP projections plus attention scores over seq_len) and the head (the LM head
// projection and the loss over the vocabulary).
std::vector<double> gpt_layer_costs(const nn::GptConfig& config, int64_t seq_len);

}  // namespace tessel::pp
