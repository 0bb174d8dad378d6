// bench/flight_recorder: what the flight recorder costs and how fast the analyzer is.
//
//   flight_recorder_bench [--iterations N] [--ranks N] [--steps N]
//
// 1. One record() (and one full record/started/completed lifecycle, a user event, a compute
//    span) timed individually with the TSC, p50/p99/p99.9, with and without stack capture,
//    beside the peer: the same entry pushed into a mutex-protected ring (the obvious
//    implementation).
// 2. The analyzer on N synthetic rank dumps (default 1,024): read + analyze wall time, for the
//    set read whole and for the streaming reader tessel-trace uses (analyze_dump_dir).
// The recorder's cost inside a real collectives loop (on vs off, 1 KiB all_reduce) is measured by
// bench_collectives, which has the process groups.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "tessel/base/clock.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/flight_recorder/synth.h"

namespace {

using namespace tessel;
using namespace tessel::fr;

// Cheap timestamps: the TSC where there is one (converted with a measured rate), else the
// monotonic clock.
inline uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(monotonic_ns());
#endif
}

double ns_per_tick() {
#if defined(__x86_64__)
  const int64_t t0 = monotonic_ns();
  const uint64_t c0 = ticks();
  while (monotonic_ns() - t0 < 50'000'000) {
  }
  return static_cast<double>(monotonic_ns() - t0) / static_cast<double>(ticks() - c0);
#else
  return 1.0;
#endif
}

struct Percentiles {
  double p50, p99, p999;
};

Percentiles percentiles(std::vector<uint64_t>& samples, double scale, double overhead_ns) {
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    const double v = samples[static_cast<size_t>(q * (samples.size() - 1))] * scale - overhead_ns;
    return std::max(v, 0.0);
  };
  return {at(0.50), at(0.99), at(0.999)};
}

RecordArgs sample_args(uint64_t seq) {
  RecordArgs a;
  a.group_id = 7;
  a.seq = seq;
  a.op = OpType::kAllReduce;
  a.reduce_op = ReduceOp::kSum;
  a.input = TensorMeta::make("bf16", {4096, 1024});
  a.output = a.input;
  return a;
}

// The peer: the obvious recorder, a mutex around a vector used as a ring, filling the same
// fields as FlightRecorder::record (uncontended here, which flatters it).
class LockedRing {
 public:
  explicit LockedRing(size_t capacity) : entries_(capacity) {}
  uint64_t record(const RecordArgs& a) {
    static thread_local const uint32_t tid = static_cast<uint32_t>(::gettid());
    std::lock_guard lock(mutex_);
    Entry& e = entries_[next_ % entries_.size()];
    e.record_id = ++next_;
    e.group_id = a.group_id;
    e.seq = a.seq;
    e.peer = a.peer;
    e.p2p_seq = a.p2p_seq;
    e.op = a.op;
    e.reduce_op = a.reduce_op;
    e.state = EntryState::kScheduled;
    e.root = a.root;
    e.coalesced_id = a.coalesced_id;
    e.coalesced_index = a.coalesced_index;
    e.callsite_id = a.callsite_id;
    e.step = step_;
    e.input = a.input;
    e.output = a.output;
    e.enqueued_ns = monotonic_ns();
    e.started_ns = e.completed_ns = 0;
    e.thread_id = tid;
    const size_t n = std::min(a.text.size(), sizeof(e.text) - 1);
    if (n > 0) std::memcpy(e.text, a.text.data(), n);
    e.text[n] = '\0';
    e.stack_depth = 0;
    return e.record_id;
  }

 private:
  std::mutex mutex_;
  std::vector<Entry> entries_;
  uint64_t next_ = 0;
  int64_t step_ = -1;
};

template <typename Fn>
Percentiles time_each(int iterations, double scale, double overhead_ns, Fn&& fn) {
  std::vector<uint64_t> samples(iterations);
  for (int i = 0; i < 1000; ++i) fn(i);  // warm up caches and the ring
  for (int i = 0; i < iterations; ++i) {
    const uint64_t t0 = ticks();
    fn(i);
    samples[i] = ticks() - t0;
  }
  return percentiles(samples, scale, overhead_ns);
}

void print_row(const char* what, const Percentiles& ours, const Percentiles* peer) {
  if (peer != nullptr) {
    std::printf("%-44s %9.1f %9.1f %9.1f   %9.1f %9.1f   %5.2fx\n", what, ours.p50, ours.p99,
                ours.p999, peer->p50, peer->p99, peer->p50 > 0 ? ours.p50 / peer->p50 : 0.0);
  } else {
    std::printf("%-44s %9.1f %9.1f %9.1f   %9s %9s   %6s\n", what, ours.p50, ours.p99, ours.p999,
                "-", "-", "-");
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200'000, ranks = 1024, steps = 12;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iterations"))
      iterations = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ranks"))
      ranks = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--iterations N] [--ranks N] [--steps N]\n", argv[0]);
      return 2;
    }
  }
  const double scale = ns_per_tick();
  std::vector<uint64_t> empty(iterations);
  for (int i = 0; i < iterations; ++i) {
    const uint64_t t0 = ticks();
    empty[i] = ticks() - t0;
  }
  const double overhead = percentiles(empty, scale, 0).p50;

  std::printf(
      "flight recorder: cost per call in ns (%d calls each; timer overhead %.1f ns "
      "subtracted)\n\n",
      iterations, overhead);
  std::printf("%-44s %9s %9s %9s   %9s %9s   %6s\n", "", "p50", "p99", "p99.9", "peer p50",
              "peer p99", "ratio");
  std::printf("%-44s %9s %9s %9s   %9s %9s   %6s\n", "", "", "", "", "(mutex", "ring)", "");

  FlightRecorder plain(RecorderOptions{4096});
  RecorderOptions with_stack_options;
  with_stack_options.capacity = 4096;
  with_stack_options.capture_stack = true;
  FlightRecorder with_stack(with_stack_options);
  LockedRing peer_ring(4096);

  const Percentiles peer =
      time_each(iterations, scale, overhead, [&](int i) { peer_ring.record(sample_args(i)); });
  const Percentiles record =
      time_each(iterations, scale, overhead, [&](int i) { plain.record(sample_args(i)); });
  print_row("record() (target p50 <= 150, p99 <= 1000)", record, &peer);
  const Percentiles lifecycle = time_each(iterations, scale, overhead, [&](int i) {
    const uint64_t id = plain.record(sample_args(i));
    plain.started(id);
    plain.completed(id);
  });
  print_row("record + started + completed", lifecycle, nullptr);
  // What a blocking call on the caller's thread costs (ProcessGroup's inline path).
  const Percentiles inline_call = time_each(iterations, scale, overhead, [&](int i) {
    plain.completed(plain.record_started(sample_args(i)));
  });
  print_row("record_started + completed (blocking call)", inline_call, nullptr);
  const Percentiles event =
      time_each(iterations, scale, overhead, [&](int) { plain.record_event("step 1200 begins"); });
  print_row("record_event(\"step 1200 begins\")", event, nullptr);
  // A compute span timed on the host (ComputeSpan on the CPU: FSDP's per-group spans).
  const Percentiles span = time_each(iterations, scale, overhead, [&](int) {
    plain.end_span(plain.begin_span("fsdp forward transformer.h.11"));
  });
  print_row("begin_span + end_span (a compute span)", span, nullptr);
  RecorderOptions file_options;
  file_options.capacity = 4096;
  file_options.ring_file = (std::filesystem::temp_directory_path() /
                            ("tessel_fr_bench_" + std::to_string(::getpid()) + ".ring"))
                               .string();
  {
    FlightRecorder file_backed(file_options);
    const Percentiles mapped =
        time_each(iterations, scale, overhead, [&](int i) { file_backed.record(sample_args(i)); });
    print_row("record() into a ring file (mmap)", mapped, &peer);
  }
  std::filesystem::remove(file_options.ring_file);
  const Percentiles stacked =
      time_each(iterations / 4, scale, overhead, [&](int i) { with_stack.record(sample_args(i)); });
  print_row("record() with stack capture", stacked, &peer);

  // Analyzer at scale.
  const auto dir =
      std::filesystem::temp_directory_path() / ("tessel_fr_bench_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  SynthOptions o;
  o.ranks = ranks;
  o.steps = steps;
  o.culprit = ranks / 2;
  Stopwatch gen;
  synth_write("skip_collective", o, dir);
  const double gen_s = gen.elapsed_seconds();
  uintmax_t bytes = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) bytes += f.file_size();
  Stopwatch read_clock;
  const DumpSet set = read_dump_dir(dir);
  const double read_s = read_clock.elapsed_seconds();
  Stopwatch analyze_clock;
  const Verdict v = analyze(set);
  const double analyze_s = analyze_clock.elapsed_seconds();
  std::printf(
      "\nanalyzer on %d synthetic rank dumps (%d steps, %.1f MiB of JSON; generated in "
      "%.2f s)\n",
      ranks, steps, bytes / 1048576.0, gen_s);
  std::printf(
      "  read + parse   %7.3f s\n  analyze        %7.3f s\n  total          %7.3f s   "
      "(target <= 10 s)\n  verdict: %s, culprits %s (expected %d)\n",
      read_s, analyze_s, read_s + analyze_s, std::string(verdict_status_name(v.status)).c_str(),
      format_rank_list(v.culprits).c_str(), o.culprit);
  Stopwatch stream_clock;
  const DirAnalysis streamed = analyze_dump_dir(dir);
  std::printf(
      "  streamed       %7.3f s   (read + analyze holding a window per rank, as "
      "tessel-trace does; same verdict: %s)\n",
      stream_clock.elapsed_seconds(),
      verdict_to_json(streamed.verdict) == verdict_to_json(v) ? "yes" : "NO");
  std::filesystem::remove_all(dir);

  return 0;
}
