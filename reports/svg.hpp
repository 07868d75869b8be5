// The charts of the HTML report (html.cpp, html_audit.cpp): inline SVG written by gradcert
// itself, styled only by the page's CSS classes (so light, dark and print follow the page).
// Knows nothing of the result model: values in, markup out. Internal to reports/.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace gradcert::reports::svg {

/// A coordinate or length as SVG text: at most one decimal, no trailing ".0".
std::string n(double x);

/// A check's figure against its tolerance on a log scale, for a table cell: the axis spans 10
/// decades below the tolerance to 2 above, the tolerance is a line at 5/6 of the width, the
/// figure a bar from the left (|figure|; 0 draws no bar, inf and nan a full one). A tolerance
/// of 0 (an exact check) draws "= 0" or a full bar. `cls` colours the bar (pass, fail, caught,
/// skip).
std::string tolerance_bar(double figure, double tolerance, const std::string& cls);

/// One line of a profile chart: a value per category (NaN: none).
struct Series {
  std::string label;
  std::vector<double> values;
};

/// Categories in order along x (grouped into bands), a log-scale y, one line per series, the
/// tolerance as a dashed line and every value above it marked. Values <= 0 sit on the bottom
/// of the axis, inf on its top.
struct Profile {
  std::string kind;                 ///< data-chart attribute ("tensor-grad", ...)
  std::string title;                ///< the chart's accessible name
  std::vector<std::string> labels;  ///< per category (short)
  std::vector<std::string> groups;  ///< per category; consecutive equal names make one band
  std::vector<Series> series;
  double tolerance = 0;  ///< 0: no line
  /// The page's x-label blocks by content and element id: a chart whose labels an earlier
  /// chart drew refers to them (<use>) instead of repeating them. Null: always drawn.
  std::map<std::string, std::string>* shared = nullptr;
};
std::string profile_chart(const Profile& p);

/// Horizontal bars, one row per run, side-by-side panels with a linear scale each (from 0),
/// optionally a reference line (e.g. 1 = the baseline). NaN values read "-".
struct Panel {
  std::string title;
  const char* format = "%.2f";  ///< printf format of the value text
  double reference = -1;        ///< < 0: none
};
struct Row {
  std::string label;
  std::vector<double> values;  ///< one per panel
};
std::string bar_panels(const std::string& kind, const std::string& title, const std::vector<Panel>& panels,
                       const std::vector<Row>& rows);

/// Vertical bars in groups (one bar per series, NaN: none) on a linear scale from 0, with
/// horizontal reference lines. `label` formats the axis and the lines' values; the axis steps
/// are 1, 2 or 5 x 10^k multiples of `unit` (1024 for KiB).
struct Group {
  std::string label;
  std::vector<double> bars;
};
struct Line {
  std::string label;
  double value = 0;
  std::string cls;  ///< "bound", "budget", ...
};
std::string grouped_bars(const std::string& kind, const std::string& title, const std::vector<Group>& groups,
                         const std::vector<Line>& lines, std::string (*label)(double), double unit = 1);

}  // namespace gradcert::reports::svg
