#pragma once
// A small-multiples line chart written as SVG text, for tessel-plot: one panel per metric
// against a shared step axis, every run overlaid in each panel with its own colour (and dash),
// a legend naming the runs, ticks and labels on both axes. No dependency beyond fmt.

#include <string>
#include <vector>

#include "run_log.h"

namespace tessel::plot {

struct Panel {
  std::string title;                     // the y axis' label: "loss (nats/byte)"
  std::string key;                       // the metric's key, kept as data-metric="..."
  std::vector<std::vector<Point>> runs;  // one series per run (an empty one is not drawn)
};

struct Chart {
  std::string title;
  std::vector<std::string> run_labels;  // the legend, in run order
  std::vector<Panel> panels;            // drawn two per row, in order
};

// The chart as a standalone SVG document (UTF-8, with an XML declaration). Each panel is a
// <g class="panel" data-metric="KEY">, each drawn series a <polyline class="series"
// data-run="LABEL" data-metric="KEY">; axis labels are <text class="x-label"> and <text
// class="y-label">, tick labels <text class="tick">. Text is XML-escaped.
std::string render_svg(const Chart& chart);

// Tick positions for [lo, hi]: multiples of 1, 2 or 5 times a power of ten, about `count` of
// them, covering the range (the first at or below lo, the last at or above hi).
std::vector<double> nice_ticks(double lo, double hi, int count = 5);

}  // namespace tessel::plot
