// tessel-plot: draws one or more training logs (train_gpt --log-json, JSON Lines) as one SVG
// picture: a panel per metric (loss, validation loss, gradient norm, learning rate, tokens/s,
// peak memory) against the step, every run overlaid with a legend.
//
//   tessel-plot single.jsonl sharded.jsonl -o runs.svg
//   tessel-plot run.jsonl --label "lr 3e-3" -o run.svg --title "one run"
//
// Only SVG is written: PNG would need a rasteriser (cairo or librsvg), which tessel does not
// depend on; convert with `rsvg-convert runs.svg -o runs.png` where librsvg2-bin is installed.
//
// Exit status (sysexits.h, as the other tools): 0 written; 64 usage; 65 a log whose content is
// wrong (a malformed line, no series) or an output that is not .svg; 66 a log that cannot be
// read; 73 an output that cannot be written. Errors are one line naming the file (and line).

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "run_log.h"
#include "svg_plot.h"
#include "tessel/base/error.h"
#include "tessel/base/tools/cli.h"

namespace {

using namespace tessel;

constexpr int kExitNoInput = 66;     // EX_NOINPUT
constexpr int kExitCantCreate = 73;  // EX_CANTCREAT

// The legend's names: --label when given, else each file's name without .jsonl (its path where
// two names would be the same).
std::vector<std::string> run_labels(const std::vector<std::string>& paths,
                                    const std::vector<std::string>& labels) {
  if (!labels.empty()) return labels;
  std::vector<std::string> out;
  std::set<std::string> stems;
  for (const std::string& p : paths) stems.insert(std::filesystem::path(p).stem().string());
  for (const std::string& p : paths) {
    out.push_back(stems.size() == paths.size() ? std::filesystem::path(p).stem().string() : p);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> logs;
  std::vector<std::string> labels;
  std::string output;
  std::string title;
  CLI::App app{
      "tessel-plot: draw train_gpt --log-json files (JSON Lines) as an SVG of loss, validation "
      "loss, gradient norm, learning rate, tokens/s and peak memory against the step, runs "
      "overlaid (docs/training.md)"};
  cli::show_defaults(app);
  app.add_option("logs", logs, "the runs' log files (JSON Lines, one object per step)")->required();
  app.add_option("-o,--output", output, "the picture to write (.svg)")->required();
  app.add_option("--label", labels,
                 "the legend's name of each run, in order (default: file names)");
  app.add_option("--title", title, "the picture's title (default: the runs' names)");
  cli::describe_options(app);
  if (const auto status = cli::parse(app, argc, argv, "tessel-plot")) return *status;

  const std::string extension = std::filesystem::path(output).extension().string();
  if (extension == ".png") {
    fmt::print(stderr,
               "tessel-plot: -o '{}': PNG is not built in (it needs a rasteriser such as cairo, "
               "which tessel does not depend on): write .svg, then rsvg-convert it\n",
               output);
    return cli::kExitBadValue;
  }
  if (extension != ".svg") {
    fmt::print(stderr, "tessel-plot: -o '{}': expected a file name ending in .svg\n", output);
    return cli::kExitBadValue;
  }
  if (!labels.empty() && labels.size() != logs.size()) {
    fmt::print(stderr, "tessel-plot: {} --label for {} logs: expected one per log (or none)\n",
               labels.size(), logs.size());
    return cli::kExitBadValue;
  }

  plot::Chart chart;
  chart.run_labels = run_labels(logs, labels);
  std::vector<plot::RunLog> runs;
  try {
    for (size_t i = 0; i < logs.size(); ++i) {
      runs.push_back(plot::read_run_log(logs[i], chart.run_labels[i]));
    }
  } catch (const IoError& e) {
    fmt::print(stderr, "tessel-plot: {}\n", e.message());
    return kExitNoInput;
  } catch (const Error& e) {
    fmt::print(stderr, "tessel-plot: {}\n", e.message());
    return cli::kExitBadValue;
  }
  // One panel per metric that some run has.
  const std::vector<plot::Metric>& metrics = plot::plot_metrics();
  for (size_t m = 0; m < metrics.size(); ++m) {
    plot::Panel panel{.title = metrics[m].title, .key = metrics[m].key, .runs = {}};
    bool any = false;
    for (const plot::RunLog& run : runs) {
      panel.runs.push_back(run.series[m]);
      any = any || !run.series[m].empty();
    }
    if (any) chart.panels.push_back(std::move(panel));
  }
  if (!title.empty()) {
    chart.title = title;
  } else {
    for (const std::string& label : chart.run_labels) {
      chart.title += (chart.title.empty() ? "" : " vs ") + label;
    }
  }

  {
    std::ofstream out(output, std::ios::binary | std::ios::trunc);
    out << plot::render_svg(chart);
    out.close();
    if (!out) {
      fmt::print(stderr, "tessel-plot: -o '{}': cannot write it (does its folder exist?)\n",
                 output);
      return kExitCantCreate;
    }
  }
  fmt::print("tessel-plot: wrote {} ({} run{}, {} panels)\n", output, runs.size(),
             runs.size() == 1 ? "" : "s", chart.panels.size());
  return 0;
}
