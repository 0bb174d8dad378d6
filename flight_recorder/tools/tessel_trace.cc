// tessel-trace: reads flight-recorder dumps and says which ranks hang the job and why.
//
//   tessel-trace analyze DIR [--json] [--json-out FILE]
//                                            verdict for a directory of dumps (tessel's, or
//                                            PyTorch's flight-recorder JSON/pickle dumps)
//   tessel-trace show FILE                   one rank's entries as a table
//   tessel-trace export DIR --perfetto OUT   Chrome trace event JSON for Perfetto
//   tessel-trace synth SCENARIO --ranks N --out DIR   synthetic dumps for a fault scenario
//   tessel-trace recover RING... --out DIR   dumps from ring files of dead processes
//
// Exit status (analyze): 0 healthy, 1 culprit found, 2 inconclusive, 3 bad input or usage.
// The other commands exit 0 on success and 3 on bad input or usage.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/base/tools/cli.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/export.h"
#include "tessel/flight_recorder/pytorch_dump.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/synth.h"

namespace {

constexpr int kExitHealthy = 0;
constexpr int kExitCulprit = 1;
constexpr int kExitInconclusive = 2;
constexpr int kExitBadInput = 3;

using namespace tessel;
using namespace tessel::fr;

// The folders right under `dir` that hold tessel dumps: per-job folders (<dir>/<run id>/), as
// under the default /tmp/tessel_fr.
std::vector<std::string> job_folders(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& sub : std::filesystem::directory_iterator(dir, ec)) {
    if (!sub.is_directory(ec)) continue;
    for (const auto& f : std::filesystem::directory_iterator(sub.path(), ec)) {
      const std::string name = f.path().filename().string();
      if (name.rfind("tessel_fr_", 0) == 0 && f.path().extension() == ".json") {
        out.push_back(sub.path().string());
        break;
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int print_problems(const DumpSet& set) {
  for (const auto& p : set.problems) std::cerr << "tessel-trace: " << p.message << "\n";
  return kExitBadInput;
}

int run_analyze(const std::string& dir, bool json, const std::string& json_out, bool skip_bad,
                int world_size, const AnalyzerOptions& options) {
  // Read and analyzed together, holding a window of each rank's entries (analyzer.h).
  const DirAnalysis analysis = analyze_dump_dir(dir, options, world_size);
  const DumpSet& set = analysis.set;
  if (set.dumps.empty()) {
    print_problems(set);
    std::cerr << "tessel-trace: no usable dump (tessel_fr_*.json) in '" << dir << "'\n";
    const auto jobs = job_folders(dir);
    if (!jobs.empty()) {
      std::cerr << "tessel-trace: it holds the dump folders of " << jobs.size()
                << " job(s), one per run id; analyze one of them:\n";
      for (const auto& j : jobs) std::cerr << "  " << j << "\n";
    }
    return kExitBadInput;
  }
  if (!set.problems.empty() && !skip_bad) {
    print_problems(set);
    std::cerr << "tessel-trace: " << set.problems.size()
              << " unusable dump(s); fix or remove them, or pass --skip-bad to analyze the "
                 "rest (their ranks then count as having no dump)\n";
    return kExitBadInput;
  }
  const Verdict& v = analysis.verdict;
  std::cout << (json ? verdict_to_json(v) : format_verdict(v));
  if (!json_out.empty()) {
    std::ofstream file(json_out, std::ios::trunc);
    file << verdict_to_json(v);
    if (!file.good()) {
      std::cerr << "tessel-trace: cannot write the verdict to '" << json_out << "'\n";
      return kExitBadInput;
    }
  }
  switch (v.status) {
    case VerdictStatus::kHealthy:
      return kExitHealthy;
    case VerdictStatus::kCulpritFound:
      return kExitCulprit;
    case VerdictStatus::kInconclusive:
      return kExitInconclusive;
  }
  return kExitBadInput;
}

int run_export(const std::string& dir, const std::string& out) {
  const DumpSet set = read_dump_dir(dir);
  if (set.dumps.empty()) {
    print_problems(set);
    std::cerr << "tessel-trace: no usable dump in '" << dir << "'\n";
    return kExitBadInput;
  }
  for (const auto& p : set.problems) std::cerr << "tessel-trace: skipped: " << p.message << "\n";
  std::ofstream file(out, std::ios::binary | std::ios::trunc);
  if (!file) {
    std::cerr << "tessel-trace: cannot write '" << out << "'\n";
    return kExitBadInput;
  }
  file << export_perfetto(set);
  file.close();
  if (!file) {
    std::cerr << "tessel-trace: error while writing '" << out << "'\n";
    return kExitBadInput;
  }
  std::cout << "wrote " << out << " (" << set.dumps.size()
            << " ranks); open it in https://ui.perfetto.dev or chrome://tracing\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "tessel-trace: names the ranks that hang a job, from flight-recorder dumps.\n"
      "analyze exits 0 healthy, 1 culprit found, 2 inconclusive, 3 bad input."};
  app.require_subcommand(1);

  std::string dir, file, out;
  bool json = false, skip_bad = false;
  std::string min_wait = "1s", stale_after = "60s";
  auto* analyze_cmd = app.add_subcommand("analyze", "verdict for a directory of dumps");
  analyze_cmd->add_option("DIR", dir, "directory holding tessel_fr_rank<R>.json files")->required();
  analyze_cmd->add_flag("--json", json, "print the verdict as JSON");
  std::string json_out;
  analyze_cmd->add_option("--json-out", json_out,
                          "also write the verdict as JSON to this file (what tessel-run reads)");
  analyze_cmd->add_flag("--skip-bad", skip_bad,
                        "analyze despite unusable dump files (their ranks count as no dump)");
  analyze_cmd
      ->add_option("--min-wait", min_wait,
                   "pending ops younger than this are in flight, not hung (unless a dump "
                   "says timeout)")
      ->capture_default_str();
  analyze_cmd
      ->add_option("--stale-after", stale_after, "a dump this much older than the newest is stale")
      ->capture_default_str();
  int world_size = -1;
  analyze_cmd->add_option("--world-size", world_size,
                          "ranks in the job, for PyTorch dumps whose highest ranks left none");

  auto* show_cmd = app.add_subcommand("show", "one rank's entries as a table");
  show_cmd->add_option("FILE", file, "a tessel_fr_rank<R>.json file (or one PyTorch dump)")
      ->required();

  auto* export_cmd = app.add_subcommand("export", "Chrome trace event JSON (Perfetto)");
  export_cmd->add_option("DIR", dir, "directory of dumps")->required();
  export_cmd->add_option("--perfetto", out, "output file")->required();

  std::string scenario;
  SynthOptions synth;
  auto* synth_cmd = app.add_subcommand("synth", "write synthetic dumps for a fault scenario");
  synth_cmd->add_option("SCENARIO", scenario, "scenario name (--list shows them)");
  bool list = false;
  synth_cmd->add_flag("--list", list, "list the scenarios");
  synth_cmd->add_option("--ranks", synth.ranks, "ranks in the job")->capture_default_str();
  synth_cmd->add_option("--steps", synth.steps, "training steps")->capture_default_str();
  synth_cmd->add_option("--culprit", synth.culprit, "the misbehaving rank")->capture_default_str();
  synth_cmd->add_option("--partner", synth.partner, "second rank of two-rank faults")
      ->capture_default_str();
  synth_cmd->add_option("--tp", synth.tp, "mesh_* scenarios: size of the tp dimension")
      ->capture_default_str();
  synth_cmd->add_option("--capacity", synth.capacity, "ring entries per rank")
      ->capture_default_str();
  synth_cmd->add_option("--seed", synth.seed, "random seed")->capture_default_str();
  synth_cmd->add_option("--out", out, "output directory");

  std::vector<std::string> rings;
  std::string recover_out;
  auto* recover_cmd = app.add_subcommand(
      "recover", "write dumps from ring files (TESSEL_FR_RING_DIR) of processes that died");
  recover_cmd
      ->add_option("RING", rings, "tessel_fr_<run id>_rank<R>.ring (or tessel_fr_<pid>.ring) files")
      ->required();
  recover_cmd->add_option("--out", recover_out, "dump directory")->required();

  if (const auto status =
          tessel::cli::parse(app, argc, argv, "tessel-trace", kExitBadInput, kExitBadInput)) {
    return *status;
  }

  try {
    if (*analyze_cmd) {
      AnalyzerOptions options;
      options.min_wait = parse_duration(min_wait);
      options.stale_after = parse_duration(stale_after);
      return run_analyze(dir, json, json_out, skip_bad, world_size, options);
    }
    if (*show_cmd) {
      std::ifstream in(file, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      if (in.good() && sniff_pytorch_dump(bytes) != ForeignFormat::kNone) {
        const int rank = rank_from_dump_name(std::filesystem::path(file).filename().string());
        std::vector<RankDump> one;
        one.push_back(parse_pytorch_dump(bytes, rank, file));
        settle_pytorch_groups(one, -1);
        std::cout << format_dump_table(one.front());
        return 0;
      }
      std::cout << format_dump_table(read_dump(file));
      return 0;
    }
    if (*export_cmd) return run_export(dir, out);
    if (*recover_cmd) {
      for (const auto& ring : rings) {
        const auto recorder = FlightRecorder::recover(ring);
        const auto path = write_dump(
            *recorder, {DumpTrigger::kRecovered, -1, "recovered from " + ring}, recover_out);
        std::cout << ring << " -> " << path.string() << "\n";
      }
      return 0;
    }
    if (*synth_cmd) {
      if (list) {
        for (auto name : synth_scenarios()) {
          std::cout << name << ": " << synth_description(name) << "\n";
        }
        return 0;
      }
      if (scenario.empty() || out.empty()) {
        std::cerr << "tessel-trace synth: need SCENARIO and --out DIR (see --list)\n";
        return kExitBadInput;
      }
      synth_write(scenario, synth, out);
      std::cout << "wrote synthetic '" << scenario << "' dumps for " << synth.ranks << " ranks to "
                << out << "\n";
      return 0;
    }
  } catch (const tessel::Error& e) {
    std::cerr << "tessel-trace: " << e.message() << "\n";
    return kExitBadInput;
  }
  return kExitBadInput;
}
