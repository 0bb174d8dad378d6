// Reading train_gpt --log-json files for tessel-plot.
#include "run_log.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tessel::plot {

const std::vector<Metric>& plot_metrics() {
  static const std::vector<Metric> metrics = {
      {"loss", "loss (nats/byte)", 1},
      {"val_loss", "validation loss (nats/byte)", 1},
      {"grad_norm", "gradient norm (before clipping)", 1},
      {"lr", "learning rate", 1},
      {"tokens_per_s", "tokens/s", 1},
      {"peak_memory_bytes", "peak memory (MiB)", 1.0 / (1024 * 1024)},
  };
  return metrics;
}

RunLog read_run_log(const std::string& path, const std::string& label) {
  std::ifstream in(path);
  if (!in) {
    throw IoError(fmt::format("{}: cannot open it: {}", path, std::strerror(errno)));
  }
  const std::vector<Metric>& metrics = plot_metrics();
  RunLog run{
      .path = path, .label = label, .series = std::vector<std::vector<Point>>(metrics.size())};
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // nlohmann's text starts "[json.exception.parse_error.101] parse error at line 1, ...".
      std::string why = e.what();
      if (const size_t at = why.find("] "); at != std::string::npos) why = why.substr(at + 2);
      throw InvalidArgument(fmt::format("{}:{}: not JSON: {}", path, number, why));
    }
    if (!object.is_object()) {
      throw InvalidArgument(fmt::format("{}:{}: expected a JSON object per line", path, number));
    }
    const auto step = object.find("step");
    if (step == object.end() || !step->is_number()) {
      throw InvalidArgument(
          fmt::format("{}:{}: expected a numeric \"step\" in every object", path, number));
    }
    for (size_t m = 0; m < metrics.size(); ++m) {
      const auto value = object.find(metrics[m].key);
      if (value == object.end() || value->is_null()) continue;
      if (!value->is_number()) {
        throw InvalidArgument(fmt::format("{}:{}: \"{}\" is {}: expected a number", path, number,
                                          metrics[m].key, value->dump()));
      }
      run.series[m].push_back({step->get<double>(), value->get<double>() * metrics[m].scale});
    }
  }
  if (in.bad()) {
    throw IoError(fmt::format("{}: cannot read it: {}", path, std::strerror(errno)));
  }
  bool any = false;
  for (const auto& s : run.series) any = any || !s.empty();
  if (!any) {
    std::string keys;
    for (const Metric& m : metrics) keys += (keys.empty() ? "" : ", ") + m.key;
    throw InvalidArgument(
        fmt::format("{}: no series: no line has any of {} (expected train_gpt "
                    "--log-json output)",
                    path, keys));
  }
  return run;
}

}  // namespace tessel::plot
