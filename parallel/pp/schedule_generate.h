#pragma once
// Built-in pipeline schedules (tessel/parallel/pp/schedule.h): GPipe, 1F1B, interleaved 1F1B
// and zero-bubble ZB-H1, for p ranks and m micro-batches, with the sends and receives inserted.
//
//   auto s = pp::make_1f1b(4, 8);          // 4 ranks, 8 micro-batches
//   auto check = pp::validate_schedule(s); // schedule_validate.h
//
// Each generator orders the compute of every rank, then add_communication() puts a receive
// right before the compute that needs a tensor from another rank and a send right after the
// compute that produces one. Each list ends with STEP. Invalid sizes throw InvalidArgument.

#include "tessel/parallel/pp/schedule.h"

namespace tessel::pp {

// All forwards, then all full backwards (micro-batch order). Any m ≥ 1. Stage 0 holds all m
// activations at its peak.
PipelineSchedule make_gpipe(int num_ranks, int num_microbatches);

// One forward, one backward (PipeDream-flush): rank r runs p−1−r warm-up forwards, then
// alternates forward and full backward, then drains. Needs m ≥ p. Rank r holds at most p−r
// activations.
PipelineSchedule make_1f1b(int num_ranks, int num_microbatches);

// Interleaved 1F1B (Megatron-LM): v virtual stages per rank (stage s on rank s % p), micro-
// batches taken in groups of p per virtual stage. Needs v ≥ 1, m ≥ p and m a multiple of p.
// Bubble ≈ (p−1)/(v·m + p−1) when every stage costs 1/v of a whole rank's layers.
PipelineSchedule make_interleaved_1f1b(int num_ranks, int num_microbatches, int virtual_stages = 2);

// Zero-bubble ZB-H1 (Qi et al., arXiv 2401.10241): 1F1B's forwards and backward-input passes
// (B), with each backward-weight pass (W) deferred: rank r lets up to r W's wait, so the B's,
// which carry the gradient to the earlier stages, run as soon as they can, and the waiting W's
// fill the end of the step, where 1F1B's later stages idle. Peak activations are p on every rank
// (as on 1F1B's stage 0); per rank the idle time is (p−1)(F+B−W) instead of 1F1B's (p−1)(F+B+W)
// when F, B and W each cost the same on every stage and links are free. Needs m ≥ p.
PipelineSchedule make_zero_bubble_h1(int num_ranks, int num_microbatches);

// By name: "gpipe", "1f1b", "interleaved-1f1b" (virtual_stages, default 2), "zero-bubble".
PipelineSchedule make_schedule(std::string_view name, int num_ranks, int num_microbatches,
                               int virtual_stages = 2);

// Given each rank's compute actions in order (no sends/receives), inserts RECV_F/RECV_B right
// before a compute that needs another rank's tensor and SEND_F/SEND_B right after a compute
// that produces one, and appends STEP. Used by the generators; public for hand-made schedules.
void add_communication(PipelineSchedule& schedule);

}  // namespace tessel::pp
