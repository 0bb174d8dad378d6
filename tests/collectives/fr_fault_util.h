#pragma once
// Helpers shared by the flight-recorder fault-injection tests (fr_fault_test.cc,
// fr_fault_scenarios_test.cc): a fresh dump directory, joining a Gloo world whose ranks dump to
// it, waiting until given ranks have dumped, an explicit (API) dump, and the analysis.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "../store/store_test_util.h"
#include "tessel/base/error.h"
#include "tessel/collectives/init.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel::testing {

// An empty directory for one test's dumps (removed first if a previous run left it).
inline std::filesystem::path fresh_fr_dir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("tessel_fr_{}_{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline bool fr_dump_exists(const std::filesystem::path& dir, int rank) {
  return std::filesystem::exists(dir / fr::dump_file_name(rank, 0));
}

// Joins a Gloo world of `world` ranks through the harness's FileStore with a 2 s collective
// timeout; the process's flight recorder dumps to `dir`.
inline std::shared_ptr<ProcessGroup> join_fr_world(int rank, int world,
                                                   const std::string& store_dir,
                                                   const std::filesystem::path& dir) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("TESSEL_FR_DUMP_DIR", dir.c_str(), 1);
  InitOptions options;
  options.backend = "gloo";
  options.store_dir = store_dir;
  options.timeout = std::chrono::seconds(2);
  options.gloo.hostname = "127.0.0.1";
  return init_process_group(options);
}

// Blocks until every rank in `ranks` has a dump in `dir`; throws Timeout (naming `rank`, the
// caller) after 20 s. A rank calls this to stay alive (and answer dump requests) until then.
inline void wait_for_fr_dumps(const std::filesystem::path& dir, const std::vector<int>& ranks,
                              int rank) {
  const bool all = wait_until(
      [&] {
        for (int r : ranks) {
          if (!fr_dump_exists(dir, r)) return false;
        }
        return true;
      },
      std::chrono::seconds(20));
  TESSEL_CHECK(all, Timeout, "rank {}: ranks {} did not all dump to {} within 20s", rank,
               fmt::join(ranks, ","), dir.string());
}

// 0, 1, ..., world - 1.
inline std::vector<int> all_ranks(int world) {
  std::vector<int> ranks(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

// The program's own dump (trigger "api"), written on the calling thread.
inline void api_dump(const std::filesystem::path& dir, int rank, const std::string& reason) {
  fr::write_dump(fr::FlightRecorder::global(), {fr::DumpTrigger::kApi, rank, reason}, dir);
}

// In a forked rank: gtest assertions there fail only that process's copy of the test, so turn
// them into the rank's exit status (the harness reports a throwing rank as "exit 1").
inline void exit_failed_if_assertions_failed(int rank) {
  if (::testing::Test::HasFailure()) {
    throw std::runtime_error(fmt::format("rank {}: an assertion failed (see above)", rank));
  }
}

// The verdict on a directory of dumps, read whole; the streaming reader (what tessel-trace
// runs) must reach the same one.
inline fr::Verdict analyze_fr_dir(const std::filesystem::path& dir) {
  fr::Verdict v = fr::analyze(fr::read_dump_dir(dir));
  EXPECT_EQ(fr::verdict_to_json(fr::analyze_dump_dir(dir).verdict), fr::verdict_to_json(v));
  return v;
}

}  // namespace tessel::testing
