// The pipeline's compute actions in the flight recorder: the runtime records each F, B, W and BW
// as a span ("F mb3 s1"), tessel-trace's Perfetto export draws them per rank on a "pipeline"
// track beside the rank's send/recv tracks (the gaps are the bubbles), and a hang's verdict says
// which action a stage stuck in compute is in. A tiny GPT runs one step on rank threads; the
// ranks' entries (one process, one recorder) are told apart by their threads' ids.

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/export.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/record_text.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/nn/gpt.h"
#include "tessel/parallel/pp/gpt_stage.h"
#include "tessel/parallel/pp/runtime.h"
#include "tessel/parallel/pp/schedule_generate.h"
#include "tessel/parallel/pp/stage_layout.h"
#include "tessel/tensor/ops.h"

namespace tessel::pp {
namespace {

using Json = nlohmann::json;

constexpr int64_t kBatch = 8;
constexpr int64_t kSeq = 8;

nn::GptConfig tiny_config() {
  return {.vocab_size = 64, .block_size = kSeq, .n_layer = 4, .n_head = 2, .n_embd = 16, .seed = 7};
}

std::pair<Tensor, Tensor> batch() {
  std::vector<int64_t> tokens, targets;
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t t = 0; t <= kSeq; ++t) {
      const int64_t v = (b * 3 + t * (b % 3 + 1)) % 64;
      if (t < kSeq) tokens.push_back(v);
      if (t > 0) targets.push_back(v);
    }
  }
  return {from_vector<int64_t>(tokens, {kBatch, kSeq}),
          from_vector<int64_t>(targets, {kBatch, kSeq})};
}

// The span text the runtime gives a compute action.
std::string span_name(const Action& a) {
  const char* kind = a.kind == ActionKind::kForward          ? "F"
                     : a.kind == ActionKind::kBackwardInput  ? "B"
                     : a.kind == ActionKind::kBackwardWeight ? "W"
                                                             : "BW";
  return std::string(kind) + " mb" + std::to_string(a.microbatch) + " s" + std::to_string(a.stage);
}

// Runs one step of `schedule` on rank threads and returns one dump per rank: the global
// recorder's dump, with each rank's entries of this step (those its thread recorded).
fr::DumpSet run_and_dump(const PipelineSchedule& schedule) {
  const int p = schedule.num_ranks;
  fr::FlightRecorder& recorder = fr::FlightRecorder::global();
  const uint64_t before = recorder.recorded();
  std::vector<uint32_t> thread_of(static_cast<size_t>(p));
  std::mutex mu;
  const std::vector<int> layout =
      uniform_layout(static_cast<int>(tiny_config().n_layer), schedule.num_stages);
  threads::run_ranks(p, [&](ProcessGroup& pg) {
    const int rank = pg.rank();
    {
      std::lock_guard lock(mu);
      thread_of[static_cast<size_t>(rank)] = static_cast<uint32_t>(::syscall(SYS_gettid));
    }
    std::vector<LocalStage> local;
    for (auto& s : make_gpt_stages(tiny_config(), layout, rank, p))
      local.push_back({s->stage(), s});
    PipelineRuntime runtime(pg.shared_from_this(), schedule, std::move(local), nn::GPT::loss,
                            {.tied_parameters = gpt_tied_parameters()});
    auto [x, y] = batch();
    runtime.step(x, y);
  });
  // One process holds every rank: its dump is written as rank 0's, then split by thread.
  if (recorder.process_info().rank < 0) recorder.set_process_info(0, p);
  const fr::RankDump all = fr::parse_dump(
      fr::dump_to_string(recorder, {fr::DumpTrigger::kApi, -1, "pp_trace_test"}), "global");
  EXPECT_GE(all.capacity, recorder.recorded() - before) << "the ring kept the whole step";
  fr::DumpSet set;
  set.world_size = p;
  for (int r = 0; r < p; ++r) {
    fr::RankDump d = all;
    d.rank = r;
    d.world_size = p;
    d.entries.clear();
    for (const auto& e : all.entries) {
      if (e.record_id > before && e.thread_id == thread_of[static_cast<size_t>(r)]) {
        d.entries.push_back(e);
      }
    }
    set.dumps.push_back(std::move(d));
  }
  return set;
}

struct Slice {
  std::string name;
  double ts, dur;
};

// Rank `rank`'s slices on the track named `track` of an exported trace, by start time.
std::vector<Slice> track_slices(const Json& trace, int rank, const std::string& track) {
  int tid = -1;
  for (const auto& ev : trace["traceEvents"]) {
    if (ev["ph"] == "M" && ev["name"] == "thread_name" && ev["pid"] == rank &&
        ev["args"]["name"] == track) {
      tid = ev["tid"].get<int>();
    }
  }
  std::vector<Slice> out;
  for (const auto& ev : trace["traceEvents"]) {
    if (ev["ph"] == "X" && ev["pid"] == rank && ev["tid"] == tid) {
      out.push_back(
          {ev["name"].get<std::string>(), ev["ts"].get<double>(), ev["dur"].get<double>()});
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Slice& a, const Slice& b) { return a.ts < b.ts; });
  return out;
}

// Every rank's pipeline track holds one slice per compute action of its schedule, named by the
// action, in schedule order, one after another; its sends and receives are on tracks of their
// own; and the last stage's first forward starts only after the first stage's has ended (the
// warm-up bubble is a gap on its track).
void expect_pipeline_tracks(const PipelineSchedule& schedule) {
  const fr::DumpSet set = run_and_dump(schedule);
  const Json trace = Json::parse(fr::export_perfetto(set));
  const int p = schedule.num_ranks;
  std::vector<std::vector<Slice>> tracks;
  for (int r = 0; r < p; ++r) {
    std::vector<std::string> expected;
    for (const Action& a : schedule.ranks[static_cast<size_t>(r)]) {
      if (is_compute(a.kind)) expected.push_back(span_name(a));
    }
    const std::vector<Slice> slices = track_slices(trace, r, "pipeline");
    std::vector<std::string> names;
    for (const Slice& s : slices) names.push_back(s.name);
    EXPECT_EQ(names, expected) << schedule.name << ", rank " << r;
    for (size_t i = 1; i < slices.size(); ++i) {
      EXPECT_LE(slices[i - 1].ts + slices[i - 1].dur, slices[i].ts + 1e-3)
          << schedule.name << ", rank " << r << ": " << slices[i - 1].name << " overlaps "
          << slices[i].name;
    }
    EXPECT_TRUE(track_slices(trace, r, "compute").empty())
        << "action spans are not drawn twice (rank " << r << ")";
    // The p2p calls are beside them, on the channels' group tracks.
    size_t p2p = 0;
    for (const auto& ev : trace["traceEvents"]) {
      if (ev["ph"] == "X" && ev["pid"] == r && (ev["cat"] == "send" || ev["cat"] == "recv")) ++p2p;
    }
    EXPECT_GT(p2p, 0u) << schedule.name << ", rank " << r;
    tracks.push_back(slices);
  }
  ASSERT_FALSE(tracks.front().empty());
  ASSERT_FALSE(tracks.back().empty());
  const Slice& first = tracks.front().front();
  EXPECT_GE(tracks.back().front().ts, first.ts + first.dur - 1e-3)
      << schedule.name << ": the last stage waited for the first stage's forward";
}

TEST(PipelineTraceTest, OneFOneBDrawsEachRanksActionsOnItsPipelineTrack) {
  expect_pipeline_tracks(make_1f1b(2, 4));
}

TEST(PipelineTraceTest, ZeroBubbleAndInterleavedDrawSplitBackwardAndVirtualStages) {
  expect_pipeline_tracks(make_schedule("zero-bubble", 2, 4, 1));
  expect_pipeline_tracks(make_schedule("interleaved-1f1b", 2, 4, 2));
}

// A dump whose rank is inside an action span that never ended: the verdict says which action,
// for how long, after which call. Written by real recorders on a fake clock: stage 0 sent
// micro-batch 0 and is stuck in F mb1 s0; stage 1 waits for micro-batch 1's activation.
int64_t g_now_ns = 1'000'000'000;
int64_t fake_clock() noexcept { return g_now_ns; }
int64_t fake_wall() noexcept { return 1'700'000'000'000'000 + g_now_ns / 1000; }

std::string dump_rank(int rank, int64_t dump_at_ns) {
  fr::RecorderOptions ro;
  ro.capacity = 32;
  ro.clock = fake_clock;
  ro.wall_clock = fake_wall;
  fr::FlightRecorder fr(ro);
  fr.set_process_info(rank, 2);
  constexpr uint64_t kAct01 = 11;
  fr.register_group(kAct01, "world/pp_act0>1", {0, 1});
  auto p2p = [&](fr::OpType op, const char* text, bool done) {
    fr::RecordArgs a;
    a.group_id = kAct01;
    a.op = op;
    a.peer = op == fr::OpType::kSend ? 1 : 0;
    a.p2p_seq = done ? 1 : 2;
    a.input = fr::TensorMeta::make("f32", {2, 8, 16});
    const fr::ScopedRecordText scope(text);
    const uint64_t id = fr.record_started(a);
    if (done) fr.completed(id);
  };
  if (rank == 0) {
    const uint64_t f0 = fr.begin_span("F mb0 s0");
    g_now_ns += 5'000'000;
    fr.end_span(f0);
    p2p(fr::OpType::kSend, "pipeline SEND_F0s0>1: mb 0, stage 0", true);
    g_now_ns += 1'000'000;
    fr.begin_span("F mb1 s0");  // never ends
  } else {
    p2p(fr::OpType::kRecv, "pipeline RECV_F0s1<0: mb 0, stage 1", true);
    const uint64_t f0 = fr.begin_span("F mb0 s1");
    g_now_ns += 5'000'000;
    fr.end_span(f0);
    p2p(fr::OpType::kRecv, "pipeline RECV_F1s1<0: mb 1, stage 1", false);
  }
  const int64_t saved = g_now_ns;
  g_now_ns = dump_at_ns;
  std::string text = fr::dump_to_string(fr, {fr::DumpTrigger::kTimeout, 1, "recv timed out"});
  g_now_ns = saved;
  return text;
}

TEST(PipelineTraceTest, VerdictNamesTheActionAStuckStageIsIn) {
  const int64_t start = g_now_ns;
  const int64_t dump_at = start + 2'100'000'000 + 6'000'000;  // F mb1 s0 began at start + 6 ms
  fr::DumpSet set;
  set.world_size = 2;
  set.dumps.push_back(fr::parse_dump(dump_rank(0, dump_at), "rank0"));
  g_now_ns = start;
  set.dumps.push_back(fr::parse_dump(dump_rank(1, dump_at), "rank1"));
  const fr::Verdict v = fr::analyze(set);
  const std::string text = fr::format_verdict(v);
  EXPECT_EQ(v.status, fr::VerdictStatus::kCulpritFound) << text;
  EXPECT_EQ(v.culprits, std::vector<int>{0}) << text;
  ASSERT_EQ(v.positions.size(), 2u) << text;
  EXPECT_EQ(v.positions[0].where, fr::RankPosition::Where::kInCompute) << text;
  EXPECT_EQ(v.positions[0].summary,
            "in compute: F mb1 s0 for 2.1s, after send #1 (group 'world/pp_act0>1'; pipeline "
            "SEND_F0s0>1: mb 0, stage 0) completed")
      << text;
  EXPECT_NE(v.positions[1].summary.find("pipeline RECV_F1s1<0: mb 1, stage 1"), std::string::npos)
      << text;
  // A finished span is no place to be: rank 1's F mb0 s1 is not named.
  EXPECT_EQ(v.positions[1].summary.find("F mb0 s1"), std::string::npos) << text;
  // The Perfetto export draws the open span to the dump's time, marked pending.
  const Json trace = Json::parse(fr::export_perfetto(set));
  const std::vector<Slice> rank0 = track_slices(trace, 0, "pipeline");
  ASSERT_EQ(rank0.size(), 2u);
  EXPECT_EQ(rank0[1].name, "F mb1 s0 (pending)");
}

}  // namespace
}  // namespace tessel::pp
