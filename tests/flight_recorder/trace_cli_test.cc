// Runs the installed-tool binary tessel-trace as a user would and checks its exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/recorder.h"
#include "test_util.h"

namespace tessel::fr {
namespace {

using testing::TempDir;

int run(const std::string& args) {
  const std::string command = std::string(TESSEL_TRACE_PATH) + " " + args + " > /dev/null 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(TraceCliTest, ExitStatusSaysHealthyCulpritInconclusiveOrBadInput) {
  TempDir dir;
  const std::string d = dir.path().string();
  ASSERT_EQ(run("synth healthy --ranks 4 --out " + d + "/healthy"), 0);
  ASSERT_EQ(run("synth skip_collective --ranks 4 --culprit 3 --out " + d + "/skip"), 0);
  ASSERT_EQ(run("synth skip_collective --ranks 2 --culprit 1 --out " + d + "/tie"), 0);
  EXPECT_EQ(run("analyze " + d + "/healthy"), 0);
  EXPECT_EQ(run("analyze " + d + "/skip"), 1);
  EXPECT_EQ(run("analyze " + d + "/skip --json"), 1);
  EXPECT_EQ(run("analyze " + d + "/tie"), 2);
  EXPECT_EQ(run("analyze " + d + "/nowhere"), 3);
  std::filesystem::create_directories(dir.path() / "empty");
  EXPECT_EQ(run("analyze " + d + "/empty"), 3);
  EXPECT_EQ(run("analyze"), 3);
  EXPECT_EQ(run("synth no_such_scenario --out " + d + "/x"), 3);

  // An unusable file stops analysis unless --skip-bad says to count its rank as dumpless.
  std::ofstream(dir.path() / "skip" / "tessel_fr_rank3.json") << "{\"format\": ";
  EXPECT_EQ(run("analyze " + d + "/skip"), 3);
  EXPECT_EQ(run("analyze --skip-bad " + d + "/skip"), 1);

  EXPECT_EQ(run("show " + d + "/healthy/tessel_fr_rank0.json"), 0);
  EXPECT_EQ(run("show " + d + "/skip/tessel_fr_rank3.json"), 3);
  EXPECT_EQ(run("export " + d + "/healthy --perfetto " + d + "/trace.json"), 0);
  EXPECT_TRUE(std::filesystem::file_size(dir.path() / "trace.json") > 0);
}

TEST(TraceCliTest, RecoverTurnsARingFileIntoADump) {
  TempDir dir;
  const std::string ring = (dir.path() / "tessel_fr_123.ring").string();
  {
    RecorderOptions o;
    o.capacity = 4;
    o.ring_file = ring;
    FlightRecorder fr(o);
    fr.set_process_info(1, 2);
    fr.record_event("last words");
  }  // the file stays, as after a SIGKILL
  ASSERT_EQ(run("recover " + ring + " --out " + (dir.path() / "dumps").string()), 0);
  const RankDump d = read_dump(dir.path() / "dumps" / "tessel_fr_rank1.json");
  EXPECT_EQ(d.trigger, DumpTrigger::kRecovered);
  ASSERT_EQ(d.entries.size(), 1u);
  EXPECT_EQ(d.entries[0].text, "last words");
  EXPECT_EQ(run("recover " + (dir.path() / "nope.ring").string() + " --out /tmp"), 3);
}

}  // namespace
}  // namespace tessel::fr
