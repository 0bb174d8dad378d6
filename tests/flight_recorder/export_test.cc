#include "tessel/flight_recorder/export.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/synth.h"
#include "test_util.h"

namespace tessel::fr {
namespace {

using testing::TempDir;

TEST(ExportTest, PerfettoHasATrackPerRankASlicePerOpAndInstantUserEvents) {
  TempDir dir;
  SynthOptions o;
  o.ranks = 5;
  o.steps = 4;
  o.culprit = 2;
  synth_write("skip_collective", o, dir.path());
  const DumpSet set = read_dump_dir(dir.path());
  const auto j = nlohmann::json::parse(export_perfetto(set));
  ASSERT_TRUE(j.contains("traceEvents"));

  std::map<int, int> process_names, slices, instants, pending;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    const int pid = e["pid"];
    if (ph == "M" && e["name"] == "process_name") ++process_names[pid];
    if (ph == "X") {
      ++slices[pid];
      EXPECT_GE(e["dur"].get<double>(), 0);
      const std::string name = e["name"];
      if (name.find("(pending)") != std::string::npos) ++pending[pid];
    }
    if (ph == "i") ++instants[pid];
  }
  for (const auto& d : set.dumps) {
    int ops = 0, events = 0, unfinished = 0;
    for (const auto& e : d.entries) {
      if (e.is_user_event()) {
        ++events;
      } else {
        ++ops;
        unfinished += e.finished() ? 0 : 1;
      }
    }
    EXPECT_EQ(process_names[d.rank], 1) << d.rank;
    EXPECT_EQ(slices[d.rank], ops) << d.rank;
    EXPECT_EQ(instants[d.rank], events) << d.rank;
    EXPECT_EQ(pending[d.rank], unfinished) << d.rank;
  }
  // The culprit skipped the last world all_reduce; everybody else is still in it.
  EXPECT_EQ(pending[2], 0);
  EXPECT_EQ(pending[0], 1);
}

// Perfetto's JSON importer takes 32-bit thread ids: every track of a rank has a small id (0 for
// markers, then one per group) and a name, and one group keeps one id across its slices.
TEST(ExportTest, TracksHaveSmallThreadIdsAndNames) {
  TempDir dir;
  SynthOptions o;
  o.ranks = 4;
  o.steps = 3;
  synth_write("healthy", o, dir.path());
  const DumpSet set = read_dump_dir(dir.path());
  const auto j = nlohmann::json::parse(export_perfetto(set));
  std::map<std::pair<int, int64_t>, std::string> names;      // (pid, tid) -> track name
  std::map<std::pair<int, std::string>, int64_t> group_tid;  // (pid, group) -> tid
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      names[{e["pid"].get<int>(), e["tid"].get<int64_t>()}] = e["args"]["name"];
    }
  }
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X" && e["ph"] != "i") continue;
    const int pid = e["pid"];
    const int64_t tid = e["tid"];
    EXPECT_GE(tid, 0);
    EXPECT_LT(tid, 64) << e.dump();
    ASSERT_TRUE(names.count({pid, tid})) << "unnamed track " << e.dump();
    if (e["ph"] == "X") {
      const std::string group = names[{pid, tid}];
      EXPECT_EQ(group.rfind("group ", 0), 0u) << group;
      auto [it, fresh] = group_tid.emplace(std::make_pair(pid, group), tid);
      EXPECT_EQ(it->second, tid) << group;
    } else {
      EXPECT_EQ(names[std::make_pair(pid, tid)], "markers");
    }
  }
  const std::string first = names[std::make_pair(0, int64_t{1})];
  EXPECT_EQ(first.substr(0, 6), "group ");
}

int64_t g_now = 0;
int64_t test_clock() noexcept { return g_now; }

// One rank's spans: complete ("X") slices on its "compute" track, from start to completion in
// microseconds of wall time; nested spans share the track, a span that outlasts the one it began
// in goes to "compute 2", an open one runs to the dump and is marked pending. Collectives keep
// their group's track and, timed on a device, start where the device started them.
TEST(ExportTest, SpansAreCompleteEventsOnTheComputeTrack) {
  RecorderOptions o;
  o.capacity = 16;
  o.clock = test_clock;
  o.wall_clock = []() noexcept -> int64_t { return 1'000'000'000; };  // us
  FlightRecorder fr(o);
  fr.set_process_info(0, 1);
  fr.register_group(1, "world", {0});
  RecordArgs a;
  a.group_id = 1;
  a.seq = 1;
  a.op = OpType::kAllGather;
  g_now = 1'000'000;
  const uint64_t outer = fr.begin_span("fsdp forward (root)");  // [1 ms, 9 ms]
  g_now = 2'000'000;
  const uint64_t gather = fr.record(a);  // issued at 2 ms, ran [3 ms, 5 ms] on the device
  const uint64_t inner = fr.begin_span("fsdp forward h.0");  // [2 ms, 4 ms], nested
  g_now = 3'000'000;
  const uint64_t across = fr.begin_span("other thread");  // [3 ms, 10 ms]: outlasts `outer`
  g_now = 4'000'000;
  fr.end_span(inner);
  g_now = 5'000'000;
  fr.completed(gather, std::chrono::milliseconds(2));
  g_now = 9'000'000;
  fr.end_span(outer);
  g_now = 10'000'000;
  fr.end_span(across);
  g_now = 11'000'000;
  fr.begin_span("fsdp backward (root)");  // open at the dump (12 ms)
  g_now = 12'000'000;
  DumpSet set;
  set.dumps.push_back(parse_dump(dump_to_string(fr, {}), "rank0"));
  const auto j = nlohmann::json::parse(export_perfetto(set));

  std::map<int64_t, std::string> tracks;  // tid -> name
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
  }
  // Wall time = monotonic + (1e9 us - 12 ms): the dump's two clocks read together.
  const double base_us = 1e9 - 12'000;
  struct Slice {
    std::string track;
    double ts, dur;
  };
  std::map<std::string, Slice> slices;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    slices[e["name"]] = {tracks[e["tid"]], e["ts"].get<double>() - base_us, e["dur"]};
  }
  ASSERT_EQ(slices.size(), 5u) << j.dump();
  auto expect = [&](const std::string& name, const std::string& track, double ts, double dur) {
    ASSERT_TRUE(slices.count(name)) << name;
    EXPECT_EQ(slices[name].track, track) << name;
    EXPECT_DOUBLE_EQ(slices[name].ts, ts) << name;
    EXPECT_DOUBLE_EQ(slices[name].dur, dur) << name;
  };
  expect("fsdp forward (root)", "compute", 1000, 8000);
  expect("fsdp forward h.0", "compute", 2000, 2000);
  expect("other thread", "compute 2", 3000, 7000);
  expect("fsdp backward (root) (pending)", "compute", 11000, 1000);
  expect("all_gather #1 (world)", "group world", 3000, 2000);
  EXPECT_EQ(tracks[1], "compute");
  EXPECT_EQ(tracks[2], "compute 2");
  EXPECT_EQ(tracks[3], "group world");
}

TEST(ExportTest, ShowTableListsEveryEntry) {
  TempDir dir;
  SynthOptions o;
  o.ranks = 3;
  o.steps = 3;
  synth_write("healthy", o, dir.path());
  const RankDump d = read_dump(dir.path() / "tessel_fr_rank1.json");
  const std::string table = format_dump_table(d);
  EXPECT_NE(table.find("rank 1 of 3"), std::string::npos) << table;
  EXPECT_NE(table.find("group 1 'world': ranks 0,1,2"), std::string::npos) << table;
  size_t rows = 0;
  for (size_t at = table.find("\n"); at != std::string::npos; at = table.find("\n", at + 1)) ++rows;
  const size_t header_lines = 3 + d.groups.size() + d.dropped.size() + 2;
  EXPECT_EQ(rows, header_lines + d.entries.size()) << table;
  EXPECT_NE(table.find("step 2 begins"), std::string::npos);
}

}  // namespace
}  // namespace tessel::fr
