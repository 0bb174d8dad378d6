#pragma once
// The check every multi-process mesh test runs on each rank: a 2x2 (dp, tp) mesh over `world`
// whose groups, local ranks and per-dimension all_reduce sums must match the layout arithmetic
// done by hand here. Throws (fails the rank) on any mismatch.

#include <memory>

#include "tessel/collectives/process_group.h"

namespace tessel::testing {

void check_two_by_two_mesh(const std::shared_ptr<ProcessGroup>& world);

}  // namespace tessel::testing
