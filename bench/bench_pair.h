#pragma once
// Paired timing for benchmarks run on every rank of a group: ours and the peer's call alternate
// round by round (which goes first alternates too) between barriers, so drift on a shared
// machine hits both alike; and a round length agreed by all ranks.

#include <algorithm>
#include <functional>
#include <vector>

#include "bench_host.h"
#include "tessel/base/clock.h"
#include "tessel/collectives/process_group.h"
#include "tessel/tensor/tensor.h"

namespace tessel::bench {

// Seconds per call of ours and the peer's, the best of `rounds` rounds of `iters` calls each,
// and the median over rounds of peer time / our time. The two alternate round by round (which
// goes first alternates too), so drift on a shared machine hits both alike; each round is timed
// on this rank between barriers.
struct PairTiming {
  double ours = 0, peer = 0;  // best seconds per call
  double median_ratio = 0;    // median over rounds of (peer / ours)
  // This process's CPU seconds per call (all threads, user + system), median over rounds: where
  // the ranks share too few cores, a ratio below 1 that matches the CPU ratio is work, not waiting.
  double ours_cpu = 0, peer_cpu = 0;
};
inline PairTiming time_pair(const std::function<void()>& ours, const std::function<void()>& peer,
                            const std::function<void()>& barrier, int iters, int rounds) {
  for (int i = 0; i < 2; ++i) {  // warm up connections and caches
    peer();
    ours();
  }
  PairTiming t{1e30, 1e30, 0};
  std::vector<double> ratios, ours_cpu, peer_cpu;
  auto timed = [&](const std::function<void()>& call, std::vector<double>& cpu) {
    barrier();
    const double cpu0 = cpu_seconds();
    const Stopwatch watch;
    for (int i = 0; i < iters; ++i) call();
    const double seconds = watch.elapsed_seconds() / iters;
    cpu.push_back((cpu_seconds() - cpu0) / iters);
    return seconds;
  };
  for (int round = 0; round < rounds; ++round) {
    double t_ours = 0, t_peer = 0;
    if (round % 2 == 0) {
      t_peer = timed(peer, peer_cpu);
      t_ours = timed(ours, ours_cpu);
    } else {
      t_ours = timed(ours, ours_cpu);
      t_peer = timed(peer, peer_cpu);
    }
    t.ours = std::min(t.ours, t_ours);
    t.peer = std::min(t.peer, t_peer);
    ratios.push_back(t_peer / t_ours);
  }
  t.median_ratio = median(ratios);
  t.ours_cpu = median(ours_cpu);
  t.peer_cpu = median(peer_cpu);
  return t;
}

// Calls per timed round: enough for the round to last about 20 ms (3 to 1000), so a scheduling
// hiccup weighs little in it. Every rank must use the same count: the slowest rank's estimate
// is agreed through the group (outside any timing).
inline int calls_per_round(ProcessGroup& pg, const std::function<void()>& peer,
                           const std::function<void()>& barrier) {
  peer();  // first call: connections, page faults
  barrier();
  const Stopwatch watch;
  for (int i = 0; i < 3; ++i) peer();
  // Nanoseconds as an integer: the backends reduce i64 exactly.
  Tensor per_call = from_vector<int64_t>({static_cast<int64_t>(watch.elapsed_seconds() / 3 * 1e9)});
  pg.all_reduce(per_call, {.op = ReduceOp::kMax});
  const double seconds = std::max<double>(per_call.data<int64_t>()[0], 1) * 1e-9;
  return static_cast<int>(std::clamp(0.02 / seconds, 3.0, 1000.0));
}

}  // namespace tessel::bench
