#pragma once
// Training logs as tessel-plot reads them: the JSON Lines that train_gpt --log-json writes (one
// object per step, {"step": 20, "loss": 2.69, "grad_norm": 0.98, ...}, and {"step": 200,
// "val_loss": 1.44} for each validation), turned into one series of (step, value) per metric.

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/base/error.h"

namespace tessel::plot {

// A metric tessel-plot draws: its key in the log, the panel's title and how a value is shown.
struct Metric {
  std::string key;    // "loss", "val_loss", "grad_norm", "lr", "tokens_per_s", ...
  std::string title;  // "loss (nats/byte)"
  double scale = 1;   // value shown = value in the log * scale (bytes -> MiB)
};

// Every metric, in panel order: loss, validation loss, grad norm, learning rate, tokens/s,
// peak memory (MiB).
const std::vector<Metric>& plot_metrics();

struct Point {
  double step = 0;
  double value = 0;
};

// One log file: a series per metric of plot_metrics(), in the same order (empty where the log
// has no value for that metric).
struct RunLog {
  std::string path;
  std::string label;  // the legend's name for the run
  std::vector<std::vector<Point>> series;
};

// Reads `path`. Blank lines are skipped; each other line must be a JSON object with a numeric
// "step"; keys that are not metrics, and null values, are ignored. Throws IoError "PATH: cannot
// open it: REASON" when it cannot be read, InvalidArgument "PATH:LINE: REASON" for a line that
// is not such an object and "PATH: no series: ..." for a file without one metric value.
RunLog read_run_log(const std::string& path, const std::string& label);

}  // namespace tessel::plot
