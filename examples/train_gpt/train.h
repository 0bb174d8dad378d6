// The training run of train_gpt: set-up from the flags, the step loop with its logs and
// checkpoints, and what is printed, saved and sampled at the end.
#pragma once

#include "flags.h"

namespace tessel::train_gpt {

// Trains (or, with --generate, samples) as the flags say; every rank of the job calls it.
// Returns the process's exit status; throws tessel::Error on failure.
int run(const Flags& f);

}  // namespace tessel::train_gpt
