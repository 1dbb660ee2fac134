// plot.cpp — a hand-written SVG of a training run (no plotting library needed), and the trace file.
#include "plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "ferry/error.h"
#include "ferry/trace.h"

namespace {
// A polyline of (x, y) points scaled into the box (left, top, width, height), with axis labels.
std::string panel(const std::vector<std::pair<double, double>>& points, double left, double top, double width,
                  double height, const std::string& title, const std::string& x_label) {
  std::string svg = fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>)", left, top,
                                width, height);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text>)", left + width / 2, top - 8,
                     title);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>)", left + width / 2,
                     top + height + 30, x_label);
  if (points.empty()) return svg;
  double x0 = points.front().first, x1 = points.front().first, y0 = points.front().second, y1 = y0;
  for (const auto& [x, y] : points) {
    x0 = std::min(x0, x); x1 = std::max(x1, x);
    y0 = std::min(y0, y); y1 = std::max(y1, y);
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  std::string line;
  for (const auto& [x, y] : points) {
    line += fmt::format("{:.1f},{:.1f} ", left + (x - x0) / (x1 - x0) * width, top + height - (y - y0) / (y1 - y0) * height);
  }
  svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="2"/>)", line);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="end">{:.4g}</text>)", left - 4, top + 10, y1);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="end">{:.4g}</text>)", left - 4, top + height, y0);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="11">{:.4g}</text>)", left, top + height + 14, x0);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="end">{:.4g}</text>)", left + width,
                     top + height + 14, x1);
  return svg;
}
}  // namespace

void write_training_plot(const std::string& path, const ferry::TrainResult& result) {
  std::vector<std::pair<double, double>> loss, accuracy;
  for (const auto& [step, value] : result.loss_curve) loss.emplace_back(static_cast<double>(step), value);
  for (const auto& e : result.history) accuracy.emplace_back(static_cast<double>(e.epoch), 100 * e.test_accuracy);
  std::string svg = R"(<svg xmlns="http://www.w3.org/2000/svg" width="900" height="360" font-family="sans-serif">)";
  svg += R"(<rect width="100%" height="100%" fill="white"/>)";
  svg += panel(loss, 60, 40, 360, 260, "training loss (at log steps)", "step");
  svg += panel(accuracy, 500, 40, 360, 260, "test accuracy, %", "epoch");
  svg += "</svg>\n";
  std::ofstream out(path);
  FERRY_CHECK(out.good(), IoError, "Cannot write the plot to '", ferry::detail::printable(path), "'");
  out << svg << std::flush;
  FERRY_CHECK(!out.fail(), IoError, "Writing the plot to '", ferry::detail::printable(path), "' failed (disk full?)");
}

void write_trace_file(const std::string& path) { ferry::write_chrome_trace(path); }
