#pragma once
// Timing helper shared by benchmarks: median seconds per call over several repetitions, each
// repetition running enough calls to last at least `min_rep` (the machine is shared and noisy).

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace tessel::bench {

inline double median_seconds(
    const std::function<void()>& fn, int reps = 7,
    std::chrono::duration<double> min_rep = std::chrono::milliseconds(40)) {
  using Clock = std::chrono::steady_clock;
  fn();  // warm-up
  int calls = 1;
  for (;;) {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    if (Clock::now() - start >= min_rep || calls >= (1 << 20)) break;
    calls *= 2;
  }
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    samples.push_back(std::chrono::duration<double>(Clock::now() - start).count() / calls);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace tessel::bench
