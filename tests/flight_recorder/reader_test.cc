#include "tessel/flight_recorder/reader.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/export.h"
#include "tessel/flight_recorder/synth.h"
#include "test_util.h"

namespace tessel::fr {
namespace {

using testing::TempDir;

std::string valid_dump_text(int rank, int world) {
  FlightRecorder fr(RecorderOptions{8});
  fr.set_process_info(rank, world);
  fr.register_group(1, "world", [&] {
    std::vector<int> r(world);
    for (int i = 0; i < world; ++i) r[i] = i;
    return r;
  }());
  RecordArgs a;
  a.group_id = 1;
  a.seq = 1;
  a.input = TensorMeta::make("f32", {4});
  fr.completed(fr.record(a));
  fr.record_event("step 0 begins");
  return dump_to_string(fr, {});
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Replaces the first occurrence of `from` in `text`.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

void expect_rejected(const std::string& text, const std::string& fragment) {
  TempDir dir;
  const auto file = dir.path() / "tessel_fr_rank0.json";
  write_file(file, text);
  try {
    read_dump(file);
    FAIL() << "accepted a bad dump; expected a message with '" << fragment << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find(file.string()), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(fragment), std::string::npos) << e.message();
  }
}

TEST(ReaderTest, RejectsMalformedDumpsNamingFileAndProblem) {
  const std::string good = valid_dump_text(0, 2);
  expect_rejected("", "not valid JSON");
  expect_rejected(good.substr(0, good.size() / 2), "truncated");
  expect_rejected("[1, 2]", "expected an object");
  expect_rejected(replaced(good, "\"rank\":0", "\"rank\":\"zero\""), "rank: expected an integer");
  expect_rejected(replaced(good, "\"hostname\":", "\"hostnome\":"), "missing field 'hostname'");
  expect_rejected(replaced(good, "\"version\":4", "\"version\":5"),
                  "version 5 is not supported; this reader understands versions 1 to 4");
  expect_rejected(replaced(good, "tessel-flight-recorder", "other-tool"), "format");
  expect_rejected(replaced(good, "\"rank\":0", "\"rank\":5"), "rank 5 is not a rank");
  expect_rejected(replaced(good, "\"op\":\"all_reduce\"", "\"op\":\"all_reduse\""),
                  "entries[0].op");
  expect_rejected(replaced(good, "\"state\":\"completed\"", "\"state\":7"),
                  "entries[0].state: expected a string");
  expect_rejected(replaced(good, "\"ranks\":[0,1]", "\"ranks\":[0,9]"), "groups[0].ranks[1]");
}

TEST(ReaderTest, ReadsADirectoryAndReportsEveryProblem) {
  TempDir dir;
  const auto d = dir.path();
  write_file(d / "tessel_fr_rank0.json", valid_dump_text(0, 5));
  write_file(d / "tessel_fr_rank1.json", valid_dump_text(1, 5));
  write_file(d / "tessel_fr_rank2.json", "{\"format\":");  // truncated
  write_file(d / "tessel_fr_rank3.json",
             replaced(valid_dump_text(3, 5), "\"version\":4", "\"version\":5"));  // unknown version
  write_file(d / "tessel_fr_rank4_copy.json", valid_dump_text(1, 5));             // duplicate rank
  write_file(d / "tessel_fr_rank9.json", valid_dump_text(2, 6));                  // other world
  write_file(d / "notes.txt", "ignored");
  const DumpSet set = read_dump_dir(d);
  ASSERT_EQ(set.dumps.size(), 2u);
  EXPECT_EQ(set.dumps[0].rank, 0);
  EXPECT_EQ(set.dumps[1].rank, 1);
  EXPECT_EQ(set.world_size, 5);
  EXPECT_EQ(set.missing_ranks, (std::vector<int>{2, 3, 4}));
  ASSERT_EQ(set.problems.size(), 4u);
  std::map<std::string, std::string> by_file;
  for (const auto& p : set.problems) {
    EXPECT_NE(p.message.find(p.path.string()), std::string::npos) << p.message;
    by_file[p.path.filename().string()] = p.message;
  }
  EXPECT_NE(by_file["tessel_fr_rank2.json"].find("not valid JSON"), std::string::npos);
  EXPECT_NE(by_file["tessel_fr_rank3.json"].find("version 5"), std::string::npos);
  EXPECT_NE(by_file["tessel_fr_rank4_copy.json"].find("rank 1 is also dumped"), std::string::npos);
  EXPECT_NE(by_file["tessel_fr_rank9.json"].find("world size 6 disagrees"), std::string::npos);
}

// Dumps written before spans existed (format version 2: tessel-trace synth healthy --ranks 2
// --steps 2 at the commit before version 3, committed as they came out) still read, analyze and
// export as they did.
TEST(ReaderTest, ReadsVersionTwoDumps) {
  const DumpSet set = read_dump_dir(FR_FIXTURES "/v2");
  ASSERT_TRUE(set.problems.empty()) << set.problems[0].message;
  ASSERT_EQ(set.dumps.size(), 2u);
  for (const RankDump& d : set.dumps) {
    EXPECT_EQ(d.version, 2);
    ASSERT_EQ(d.entries.size(), 6u);
    EXPECT_TRUE(d.entries[0].is_user_event());
    EXPECT_EQ(d.entries[0].text, "step 0 begins");
    EXPECT_TRUE(d.entries[1].is_collective());
    EXPECT_EQ(d.entries[1].op, OpType::kAllReduce);
    for (const TraceEntry& e : d.entries) EXPECT_FALSE(e.is_span());
  }
  EXPECT_EQ(analyze(set).status, VerdictStatus::kHealthy);
  const std::string trace = export_perfetto(set);
  EXPECT_NE(trace.find("\"group world\""), std::string::npos);
  EXPECT_EQ(trace.find("\"compute\""), std::string::npos);
}

TEST(ReaderTest, MissingDirectoryIsAClearError) {
  TempDir dir;
  EXPECT_THROW(read_dump_dir(dir.path() / "nope"), InvalidArgument);
  EXPECT_THROW(read_dump(dir.path() / "nope.json"), IoError);
  const DumpSet empty = read_dump_dir(dir.path());
  EXPECT_TRUE(empty.dumps.empty());
  EXPECT_THROW(analyze(empty), InvalidArgument);
}

// Random damage to valid dumps: the reader (and the analyzer on what it accepts) may only
// throw tessel::Error. Fixed seed and iteration count; a time cap keeps slow machines bounded.
TEST(ReaderFuzzTest, MutatedDumpsOnlyEverThrowTesselErrors) {
  TempDir dir;
  SynthOptions o;
  o.ranks = 3;
  o.steps = 3;
  synth_write("send_without_recv", o, dir.path());
  const DumpSet base = read_dump_dir(dir.path());
  ASSERT_EQ(base.dumps.size(), 3u);
  std::vector<std::string> texts;
  for (const auto& d : base.dumps) {
    std::ifstream in(d.path, std::ios::binary);
    texts.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::mt19937_64 rng(20261121);
  const std::string alphabet = "{}[],:\"0123456789-abcxyz \\\n\x01\xff";
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const Stopwatch clock;
  int accepted = 0, iterations = 0;
  for (; iterations < 4000 && clock.elapsed_seconds() < 20; ++iterations) {
    const size_t which = pick(texts.size());
    std::string t = texts[which];
    const int edits = 1 + static_cast<int>(pick(4));
    for (int k = 0; k < edits && !t.empty(); ++k) {
      const size_t at = pick(t.size());
      switch (pick(8)) {
        case 0:
          t[at] = alphabet[pick(alphabet.size())];
          break;  // flip a byte
        case 1:
          t.erase(at, 1 + pick(40));
          break;  // delete
        case 2:
          t.insert(at, 1, alphabet[pick(alphabet.size())]);
          break;  // insert
        case 3:
          t.resize(at);
          break;  // truncate
        case 4:
          t.insert(at, t.substr(pick(t.size()), 1 + pick(60)));
          break;   // duplicate
        case 5: {  // big number
          const size_t digit = t.find_first_of("0123456789", at);
          if (digit != std::string::npos) t.insert(digit, "99999999999999999999");
          break;
        }
        case 6: {  // another digit: usually still a valid dump with odd values
          const size_t digit = t.find_first_of("0123456789", at);
          if (digit != std::string::npos) t[digit] = static_cast<char>('0' + pick(10));
          break;
        }
        case 7: {  // a number becomes -1 or 0
          const size_t digit = t.find_first_of("0123456789", at);
          if (digit != std::string::npos) t.insert(digit, pick(2) ? "-" : "0");
          break;
        }
      }
    }
    try {
      RankDump d = parse_dump(t, "fuzz");
      ++accepted;
      DumpSet set;
      set.world_size = d.world_size;
      for (size_t i = 0; i < base.dumps.size(); ++i) {
        if (i != which && base.dumps[i].rank != d.rank &&
            base.dumps[i].world_size == d.world_size) {
          set.dumps.push_back(base.dumps[i]);
        }
      }
      set.dumps.push_back(std::move(d));
      const Verdict v = analyze(set);
      EXPECT_FALSE(format_verdict(v).empty());
      EXPECT_FALSE(verdict_to_json(v).empty());
    } catch (const Error&) {
      // expected for most mutations
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iterations << ": non-tessel exception: " << e.what();
    }
  }
  EXPECT_GT(iterations, 0);
  RecordProperty("iterations", iterations);
  RecordProperty("accepted", accepted);
  std::printf("fuzz: %d iterations, %d accepted\n", iterations, accepted);
}

}  // namespace
}  // namespace tessel::fr
