// SVG rendering of tessel-plot's small-multiples chart.
#include "svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace tessel::plot {
namespace {

// Layout, in SVG user units (pixels at 100 %).
constexpr double kWidth = 960;
constexpr double kHeaderHeight = 64;  // the title and the legend
constexpr double kPanelWidth = kWidth / 2;
constexpr double kPanelHeight = 250;
constexpr double kLeft = 72, kRight = 18, kTop = 30, kBottom = 44;  // plot area inside a panel

// Colours that stay apart for the colour-blind (Okabe-Ito), then dashes to tell overlaid runs
// apart where their curves coincide.
constexpr const char* kColours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};
constexpr const char* kDashes[] = {"", "7 4", "2 3", "10 3 2 3"};

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A tick's text: fixed decimals from the tick spacing, "35k" / "1.2M" for large values and
// "3.0e-04" for small ones.
std::string tick_label(double value, double spacing, double magnitude) {
  if (std::abs(value) < spacing * 1e-6) return "0";
  if (magnitude >= 1e6) return fmt::format("{:g}M", value / 1e6);
  if (magnitude >= 1e4) return fmt::format("{:g}k", value / 1e3);
  if (magnitude < 1e-2) return fmt::format("{:.1e}", value);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(spacing) + 1e-9)));
  return fmt::format("{:.{}f}", value, decimals);
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

void draw_panel(std::string& svg, const Chart& chart, size_t index, const Range& steps) {
  const Panel& panel = chart.panels[index];
  const double x0 = static_cast<double>(index % 2) * kPanelWidth;
  const double y0 = kHeaderHeight + static_cast<double>(index / 2) * kPanelHeight;
  const double left = x0 + kLeft, right = x0 + kPanelWidth - kRight;
  const double top = y0 + kTop, bottom = y0 + kPanelHeight - kBottom;

  Range values;
  for (const auto& run : panel.runs) {
    for (const Point& p : run) values.add(p.value);
  }
  svg += fmt::format("<g class=\"panel\" data-metric=\"{}\">\n", escape(panel.key));
  svg += fmt::format(
      "<text class=\"y-label\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" "
      "font-weight=\"bold\">{}</text>\n",
      left, y0 + 20, escape(panel.title));
  if (values.empty()) {
    svg += fmt::format(
        "<text class=\"note\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" "
        "fill=\"#777\">no values in these runs</text>\n</g>\n",
        (left + right) / 2, (top + bottom) / 2);
    return;
  }
  const std::vector<double> yt = nice_ticks(values.lo, values.hi);
  const std::vector<double> xt = nice_ticks(steps.lo, steps.hi);
  const double ylo = yt.front(), yhi = yt.back(), xlo = xt.front(), xhi = xt.back();
  auto px = [&](double step) { return left + (step - xlo) / (xhi - xlo) * (right - left); };
  auto py = [&](double value) { return bottom - (value - ylo) / (yhi - ylo) * (bottom - top); };

  // Grid and ticks, then the frame over them.
  const double ymag = std::max(std::abs(ylo), std::abs(yhi));
  for (const double t : yt) {
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>\n",
        left, py(t), right, py(t));
    svg += fmt::format(
        "<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6,
        py(t) + 4, escape(tick_label(t, yt[1] - yt[0], ymag)));
  }
  const double xmag = std::max(std::abs(xlo), std::abs(xhi));
  for (const double t : xt) {
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>\n",
        px(t), top, px(t), bottom);
    svg += fmt::format(
        "<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(t),
        bottom + 16, escape(tick_label(t, xt[1] - xt[0], xmag)));
  }
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#444\"/>\n",
      left, top, right - left, bottom - top);
  svg += fmt::format(
      "<text class=\"x-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n",
      (left + right) / 2, bottom + 34);

  // The runs, first run on top of nothing and each later one dashed over it.
  for (size_t r = 0; r < panel.runs.size(); ++r) {
    const auto& run = panel.runs[r];
    if (run.empty()) continue;
    const char* colour = kColours[r % std::size(kColours)];
    const char* dash = kDashes[r % std::size(kDashes)];
    const std::string& label = chart.run_labels[r];
    std::string points;
    for (const Point& p : run) points += fmt::format("{:.1f},{:.1f} ", px(p.step), py(p.value));
    points.pop_back();
    svg += fmt::format(
        "<polyline class=\"series\" data-run=\"{}\" data-metric=\"{}\" fill=\"none\" "
        "stroke=\"{}\" stroke-width=\"{}\"{} points=\"{}\"><title>{}</title></polyline>\n",
        escape(label), escape(panel.key), colour, r == 0 ? 2.5 : 1.6,
        *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "", points, escape(label));
    if (run.size() <= 40) {  // sparse series (validation): a marker per point
      for (const Point& p : run) {
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"/>\n",
                           px(p.step), py(p.value), r == 0 ? 4 : 2.5, colour);
      }
    }
  }
  svg += "</g>\n";
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!(hi > lo)) {  // one value: a unit-wide range around it
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(count, 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double spacing = power;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    spacing = m * power;
    if (spacing >= raw) break;
  }
  std::vector<double> ticks;
  const double first = std::floor(lo / spacing + 1e-9) * spacing;
  while (ticks.empty() || ticks.back() < hi - spacing * 1e-9) {
    ticks.push_back(first + static_cast<double>(ticks.size()) * spacing);
  }
  if (ticks.size() < 2) ticks.push_back(ticks.back() + spacing);
  return ticks;
}

std::string render_svg(const Chart& chart) {
  Range steps;
  for (const Panel& panel : chart.panels) {
    for (const auto& run : panel.runs) {
      for (const Point& p : run) steps.add(p.step);
    }
  }
  if (steps.empty()) steps.add(0);
  const size_t rows = (chart.panels.size() + 1) / 2;
  const double height = kHeaderHeight + static_cast<double>(rows) * kPanelHeight;
  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" "
      "font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text class=\"title\" x=\"{2}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{3}</text>\n",
      kWidth, height, kLeft, escape(chart.title));
  // The legend: a line sample in each run's colour and dash, then its label.
  double x = kLeft;
  for (size_t r = 0; r < chart.run_labels.size(); ++r) {
    const char* dash = kDashes[r % std::size(kDashes)];
    svg += fmt::format(
        "<g class=\"legend\" data-run=\"{0}\"><line x1=\"{1:.1f}\" y1=\"44\" x2=\"{2:.1f}\" "
        "y2=\"44\" stroke=\"{3}\" stroke-width=\"{4}\"{5}/><text x=\"{6:.1f}\" y=\"48\">{0}</text>"
        "</g>\n",
        escape(chart.run_labels[r]), x, x + 32, kColours[r % std::size(kColours)],
        r == 0 ? 2.5 : 1.6, *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "", x + 38);
    x += 38 + 7.5 * static_cast<double>(chart.run_labels[r].size()) + 24;
  }
  for (size_t i = 0; i < chart.panels.size(); ++i) draw_panel(svg, chart, i, steps);
  svg += "</svg>\n";
  return svg;
}

}  // namespace tessel::plot
