#include "tessel/flight_recorder/dump.h"

#include <gtest/gtest.h>

#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/internal/json_sink.h"
#include "tessel/flight_recorder/reader.h"
#include "test_util.h"

namespace tessel::fr {
namespace {

using testing::TempDir;

TEST(JsonSinkTest, FormatsIntegersLikeTheStandardLibrary) {
  const int64_t values[] = {0, 1, -1, 9, 10, 12345, INT64_MAX, INT64_MIN};
  for (int64_t v : values) {
    std::string out;
    char buffer[256];
    {
      internal::JsonSink sink(&out, buffer, sizeof(buffer));
      sink.i64(v);
    }
    EXPECT_EQ(out, std::to_string(v));
  }
  std::string out;
  char buffer[256];
  {
    internal::JsonSink sink(&out, buffer, sizeof(buffer));
    sink.u64(UINT64_MAX).raw(" ").hex(0).raw(" ").hex(0xdeadbeef);
  }
  EXPECT_EQ(out, std::to_string(UINT64_MAX) + " \"0x0\" \"0xdeadbeef\"");
}

TEST(JsonSinkTest, EscapedStringsParseBackIdentically_SmallBuffer) {
  // A 256-byte buffer forces many flushes through a long string.
  std::string text = "quote\" backslash\\ newline\n tab\t bell\x07 high\xff end";
  text += std::string(1000, 'y');
  std::string out;
  char buffer[256];
  {
    internal::JsonSink sink(&out, buffer, sizeof(buffer));
    sink.str(text);
  }
  const std::string back = nlohmann::json::parse(out).get<std::string>();
  std::string expected = text;
  expected.replace(expected.find('\xff'), 1, "\xc3\xbf");  // \u00ff reads back as UTF-8
  EXPECT_EQ(back, expected);
}

TEST(DumpTest, RoundTripsEveryField) {
  RecorderOptions o;
  o.capacity = 8;
  o.capture_stack = true;
  // Nanosecond ticks read back exactly; cycle-clock times are converted per read (their
  // agreement is RecorderTest.CycleClockTimesAgreeWithTheMonotonicClock's).
  o.use_cycle_clock = false;
  FlightRecorder fr(o);
  fr.set_process_info(2, 4);
  fr.register_group(7, "dp \"outer\"", {0, 2});
  fr.set_step(41);
  RecordArgs a;
  a.group_id = 7;
  a.seq = 3;
  a.op = OpType::kBroadcast;
  a.root = 1;
  a.coalesced_id = 5;
  a.coalesced_index = 2;
  a.callsite_id = 99;
  a.input = TensorMeta::make("bf16", {3, 5});
  a.output = a.input;
  const uint64_t id = fr.record(a);
  fr.started(id);
  fr.completed(id);
  RecordArgs s;
  s.group_id = 7;
  s.op = OpType::kSend;
  s.peer = 1;
  s.p2p_seq = 4;
  fr.record(s);
  fr.record_event("step 41 begins");

  TempDir dir;
  const auto path = write_dump(fr, {DumpTrigger::kTimeout, 2, "all_reduce timed out"}, dir.path());
  EXPECT_EQ(path.filename(), "tessel_fr_rank2.json");
  const RankDump d = read_dump(path);
  EXPECT_EQ(d.version, kDumpFormatVersion);
  EXPECT_EQ(d.rank, 2);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.hostname, fr.process_info().hostname);
  EXPECT_EQ(d.pid, fr.process_info().pid);
  EXPECT_EQ(d.trigger, DumpTrigger::kTimeout);
  EXPECT_EQ(d.initiator, 2);
  EXPECT_EQ(d.reason, "all_reduce timed out");
  EXPECT_EQ(d.capacity, 8u);
  EXPECT_EQ(d.recorded, 3u);
  EXPECT_EQ(d.step, 41);
  EXPECT_TRUE(d.stack_captured);
  ASSERT_EQ(d.groups.size(), 1u);
  EXPECT_EQ(d.groups[0].name, "dp \"outer\"");
  EXPECT_EQ(d.groups[0].ranks, (std::vector<int>{0, 2}));

  const auto snap = fr.snapshot();
  ASSERT_EQ(d.entries.size(), snap.size());
  for (size_t i = 0; i < snap.size(); ++i) {
    const Entry& want = snap[i];
    const TraceEntry& got = d.entries[i];
    EXPECT_EQ(got.record_id, want.record_id);
    EXPECT_EQ(got.group_id, want.group_id);
    EXPECT_EQ(got.seq, want.seq);
    EXPECT_EQ(got.peer, want.peer);
    EXPECT_EQ(got.p2p_seq, want.p2p_seq);
    EXPECT_EQ(got.op, want.op);
    EXPECT_EQ(got.reduce_op, want.reduce_op);
    EXPECT_EQ(got.state, want.state);
    EXPECT_EQ(got.root, want.root);
    EXPECT_EQ(got.coalesced_id, want.coalesced_id);
    EXPECT_EQ(got.coalesced_index, want.coalesced_index);
    EXPECT_EQ(got.callsite_id, want.callsite_id);
    EXPECT_EQ(got.step, want.step);
    EXPECT_STREQ(got.input.dtype, want.input.dtype);
    EXPECT_EQ(got.input.ndim, want.input.ndim);
    EXPECT_EQ(got.input.numel, want.input.numel);
    EXPECT_EQ(got.enqueued_ns, want.enqueued_ns);
    EXPECT_EQ(got.started_ns, want.started_ns);
    EXPECT_EQ(got.completed_ns, want.completed_ns);
    EXPECT_EQ(got.thread_id, want.thread_id);
    EXPECT_EQ(got.text, want.text);
    ASSERT_EQ(got.stack.size(), want.stack_depth);
    for (size_t k = 0; k < got.stack.size(); ++k) EXPECT_EQ(got.stack[k], want.stack[k]);
  }
  EXPECT_EQ(d.entries[0].input.shape[1], 5);
}

// Spans (finished on the host, finished from a device time, still open) come back from a dump
// as spans with their text and times, and are neither collectives nor user events.
TEST(DumpTest, RoundTripsSpans) {
  RecorderOptions o;
  o.capacity = 8;
  o.use_cycle_clock = false;  // nanosecond ticks read back exactly
  FlightRecorder fr(o);
  fr.set_process_info(0, 2);
  fr.register_group(1, "world", {0, 1});
  fr.set_step(3);
  RecordArgs a;
  a.group_id = 1;
  a.seq = 1;
  a.op = OpType::kAllGather;
  const uint64_t gather = fr.record(a);
  const uint64_t host = fr.begin_span("fsdp forward transformer.h.0");
  fr.started(gather);
  fr.end_span(host);
  fr.completed(gather);
  fr.completed(fr.begin_span("fsdp backward transformer.h.0"), Nanoseconds(10));
  fr.begin_span("fsdp backward (root)");  // never ended

  TempDir dir;
  const RankDump d = read_dump(write_dump(fr, {}, dir.path()));
  EXPECT_EQ(d.version, kDumpFormatVersion);
  const auto snap = fr.snapshot();
  ASSERT_EQ(d.entries.size(), snap.size());
  ASSERT_EQ(d.entries.size(), 4u);
  for (size_t i = 0; i < snap.size(); ++i) {
    const TraceEntry& got = d.entries[i];
    EXPECT_EQ(got.op, snap[i].op) << i;
    EXPECT_EQ(got.text, snap[i].text) << i;
    EXPECT_EQ(got.state, snap[i].state) << i;
    EXPECT_EQ(got.started_ns, snap[i].started_ns) << i;
    EXPECT_EQ(got.completed_ns, snap[i].completed_ns) << i;
    EXPECT_EQ(got.step, 3) << i;
    EXPECT_EQ(got.is_span(), i > 0) << i;
    EXPECT_EQ(got.is_collective(), i == 0) << i;
    EXPECT_FALSE(got.is_user_event()) << i;
  }
  EXPECT_EQ(d.entries[1].text, "fsdp forward transformer.h.0");
  EXPECT_EQ(d.entries[2].state, EntryState::kCompleted);
  EXPECT_EQ(d.entries[2].completed_ns - d.entries[2].started_ns, 10);
  EXPECT_EQ(d.entries[3].state, EntryState::kStarted);
  EXPECT_EQ(d.entries[3].completed_ns, 0);
}

// An entry's thread purpose is written and read back; a dump without the field reads as "".
TEST(DumpTest, RoundTripsThreadPurpose) {
  FlightRecorder fr(RecorderOptions{8});
  fr.set_process_info(0, 2);
  fr.register_group(1, "world", {0, 1});
  fr.set_step(5);
  RecordArgs a;
  a.group_id = 1;
  a.seq = 1;
  fr.record(a);
  {
    ThreadScope scope("checkpoint writer");
    a.seq = 2;
    fr.record(a);
  }
  TempDir dir;
  const std::string path = write_dump(fr, {}, dir.path());
  const RankDump d = read_dump(path);
  ASSERT_EQ(d.entries.size(), 2u);
  EXPECT_EQ(d.entries[0].purpose, "");
  EXPECT_EQ(d.entries[0].step, 5);
  EXPECT_EQ(d.entries[1].purpose, "checkpoint writer");
  EXPECT_EQ(d.entries[1].step, -1);
  // Older writers have no "purpose": the field is optional.
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  for (auto& e : j["entries"]) e.erase("purpose");
  std::ofstream(path) << j.dump();
  EXPECT_EQ(read_dump(path).entries[1].purpose, "");
}

TEST(DumpTest, LeavesNoTemporaryFilesAndReplacesTheOldDump) {
  FlightRecorder fr(RecorderOptions{4});
  fr.set_process_info(0, 1);
  TempDir dir;
  write_dump(fr, {}, dir.path());
  fr.record_event("second");
  write_dump(fr, {}, dir.path());
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"tessel_fr_rank0.json"}));
  EXPECT_EQ(read_dump(dir.path() / "tessel_fr_rank0.json").entries.size(), 1u);
}

TEST(DumpTest, UnknownRankUsesThePid) {
  EXPECT_EQ(dump_file_name(5, 123), "tessel_fr_rank5.json");
  EXPECT_EQ(dump_file_name(-1, 123), "tessel_fr_pid123.json");
}

TEST(DumpTest, UnwritableDirectoryIsAnIoErrorNamingIt) {
  FlightRecorder fr(RecorderOptions{4});
  TempDir dir;
  const auto file = dir.path() / "plain_file";
  std::ofstream(file) << "x";
  try {
    write_dump(fr, {}, file / "sub");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("plain_file"), std::string::npos) << e.message();
  }
}

TEST(DumpTest, TriggerNamesRoundTrip) {
  for (auto t :
       {DumpTrigger::kApi, DumpTrigger::kTimeout, DumpTrigger::kStoreRequest, DumpTrigger::kSignal,
        DumpTrigger::kError, DumpTrigger::kFatalSignal, DumpTrigger::kRecovered}) {
    EXPECT_EQ(parse_trigger(trigger_name(t)), t);
  }
  EXPECT_FALSE(parse_trigger("bogus").has_value());
}

TEST(DumpTest, DumpToStringIsValidJsonWhileRecordersRun) {
  FlightRecorder fr(RecorderOptions{32});
  fr.set_process_info(0, 1);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t s = 1; !stop.load(); ++s) {
      RecordArgs a;
      a.group_id = 1;
      a.seq = s;
      fr.completed(fr.record(a));
    }
  });
  for (int i = 0; i < 50; ++i) {
    const std::string text = dump_to_string(fr, {});
    EXPECT_NO_THROW(parse_dump(text, "concurrent"));
  }
  stop = true;
  writer.join();
}

}  // namespace
}  // namespace tessel::fr
