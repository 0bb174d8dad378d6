// Pipeline hangs in tessel-trace's terms: each rank's sends and receives carry the pipeline action
// they serve (ScopedRecordText, as parallel/pp's runtime records them), and the verdict names
// the stage, micro-batch and action where the pipeline stopped, blaming the stage that never
// sent and none of the stages that only wait. Dumps are written by real recorders, one per rank,
// as a three-stage 1F1B pipeline whose stage 0 stays in compute after micro-batch 0.

#include <gtest/gtest.h>

#include <string>

#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/record_text.h"
#include "tessel/flight_recorder/recorder.h"
#include "test_util.h"

namespace tessel::fr {
namespace {

using testing::TempDir;

int64_t g_now_ns = 1'000'000'000;
int64_t fake_clock() noexcept { return g_now_ns; }
int64_t fake_wall() noexcept { return 1'700'000'000'000'000 + g_now_ns / 1000; }

// The runtime's point-to-point groups: one per direction and kind, members {sender, receiver}.
constexpr uint64_t kAct01 = 11, kAct12 = 12, kGrad21 = 13;

struct P2p {
  uint64_t group;
  OpType op;
  int peer;  // group rank
  uint64_t seq;
  const char* action;  // the runtime's text
  bool done;
};

void record_rank(int rank, const std::vector<P2p>& ops, const TempDir& dir) {
  RecorderOptions ro;
  ro.capacity = 32;
  ro.clock = fake_clock;
  ro.wall_clock = fake_wall;
  FlightRecorder fr(ro);
  fr.set_process_info(rank, 3);
  fr.register_group(kAct01, "world/pp_act0>1", {0, 1});
  fr.register_group(kAct12, "world/pp_act1>2", {1, 2});
  fr.register_group(kGrad21, "world/pp_grad2>1", {2, 1});
  for (const P2p& p : ops) {
    g_now_ns += 1'000'000;
    RecordArgs a;
    a.group_id = p.group;
    a.op = p.op;
    a.peer = p.peer;
    a.p2p_seq = p.seq;
    a.input = TensorMeta::make("f32", {2, 8, 16});
    const ScopedRecordText text(p.action);
    const uint64_t id = fr.record(a);
    fr.started(id);
    if (p.done) fr.completed(id);
  }
  const int64_t saved = g_now_ns;
  g_now_ns += 60'000'000'000;  // the watchdog's timeout later
  write_dump(fr, {DumpTrigger::kTimeout, 1, "recv timed out"}, dir.path());
  g_now_ns = saved;
}

TEST(PipelineHangTest, TheStageThatNeverSendsIsNamedWithItsAction) {
  TempDir dir;
  // Stage 0 sent micro-batch 0's activation, then stayed in compute: no SEND_F1s0>1.
  record_rank(0, {{kAct01, OpType::kSend, 1, 1, "pipeline SEND_F0s0>1: mb 0, stage 0", true}}, dir);
  // Stage 1 passed micro-batch 0 on and waits for micro-batch 1.
  record_rank(1,
              {{kAct01, OpType::kRecv, 0, 1, "pipeline RECV_F0s1<0: mb 0, stage 1", true},
               {kAct12, OpType::kSend, 1, 1, "pipeline SEND_F0s1>2: mb 0, stage 1", true},
               {kAct01, OpType::kRecv, 0, 2, "pipeline RECV_F1s1<0: mb 1, stage 1", false}},
              dir);
  // Stage 2 ran micro-batch 0's forward and backward and waits for micro-batch 1 too.
  record_rank(2,
              {{kAct12, OpType::kRecv, 0, 1, "pipeline RECV_F0s2<1: mb 0, stage 2", true},
               {kGrad21, OpType::kSend, 1, 1, "pipeline SEND_B0s2>1: mb 0, stage 2", true},
               {kAct12, OpType::kRecv, 0, 2, "pipeline RECV_F1s2<1: mb 1, stage 2", false}},
              dir);
  const Verdict v = analyze(read_dump_dir(dir.path()));
  const std::string text = format_verdict(v);
  EXPECT_EQ(v.status, VerdictStatus::kCulpritFound) << text;
  EXPECT_EQ(v.culprits, std::vector<int>{0}) << "the waiting stages are not blamed\n" << text;
  ASSERT_FALSE(v.findings.empty()) << text;
  EXPECT_EQ(v.findings[0].kind, FindingKind::kUnmatchedRecv) << text;
  EXPECT_NE(v.findings[0].summary.find("recv #2 at rank 1 from rank 0 in group "
                                       "'world/pp_act0>1' (pipeline RECV_F1s1<0: mb 1, stage 1) "
                                       "has no matching send: rank 0 never posted it"),
            std::string::npos)
      << text;
  ASSERT_EQ(v.positions.size(), 3u);
  // Where each stage is, in pipeline terms.
  EXPECT_EQ(v.positions[0].where, RankPosition::Where::kInCompute) << text;
  EXPECT_NE(v.positions[0].summary.find("since send #1 (group 'world/pp_act0>1'; pipeline "
                                        "SEND_F0s0>1: mb 0, stage 0) completed"),
            std::string::npos)
      << v.positions[0].summary;
  EXPECT_NE(v.positions[2].summary.find("pipeline RECV_F1s2<1: mb 1, stage 2"), std::string::npos)
      << v.positions[2].summary;
  // tessel-trace reads the dumps as a stream: the same verdict.
  EXPECT_EQ(verdict_to_json(analyze_dump_dir(dir.path()).verdict), verdict_to_json(v));
}

TEST(PipelineHangTest, RecordTextScopesNestAndLeaveOwnTextAlone) {
  FlightRecorder fr(RecorderOptions{8});
  EXPECT_EQ(record_text(), "");
  {
    const ScopedRecordText outer("pipeline SEND_F0s0>1: mb 0, stage 0");
    {
      const ScopedRecordText inner(std::string(80, 'x'));  // truncated to the entry's field
      EXPECT_EQ(record_text().size(), kMaxRecordText - 1);
    }
    EXPECT_EQ(record_text(), "pipeline SEND_F0s0>1: mb 0, stage 0");
    RecordArgs send;
    send.op = OpType::kSend;
    send.peer = 1;
    send.p2p_seq = 1;
    fr.record(send);
    fr.record_event("own text");
  }
  EXPECT_EQ(record_text(), "");
  const auto entries = fr.snapshot();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_STREQ(entries[0].text, "pipeline SEND_F0s0>1: mb 0, stage 0");
  EXPECT_STREQ(entries[1].text, "own text");
}

}  // namespace
}  // namespace tessel::fr
