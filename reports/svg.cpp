#include "reports/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "conformance/core/format.hpp"

namespace gradcert::reports::svg {

namespace {

std::string esc(const std::string& s) { return xml_escape(s); }

// The opening tag every chart shares: its kind (for tests and scripts), size and name.
std::string open(const std::string& cls, const std::string& kind, double w, double h, const std::string& title) {
  return "<svg class=\"" + cls + "\" data-chart=\"" + kind + "\" viewBox=\"0 0 " + n(w) + " " + n(h) + "\" width=\"" +
         n(w) + "\" height=\"" + n(h) + "\" role=\"img\" aria-label=\"" + esc(title) + "\">";
}

std::string text(const std::string& cls, double x, double y, const std::string& s, const char* anchor = nullptr) {
  std::string t = "<text class=\"" + cls + "\" x=\"" + n(x) + "\" y=\"" + n(y) + "\"";
  if (anchor) t += std::string(" text-anchor=\"") + anchor + "\"";
  return t + ">" + esc(s) + "</text>";
}

std::string decade(int k) { return "1e" + std::to_string(k); }

// A step of 1, 2 or 5 x 10^k near span / parts.
double nice_step(double span, int parts) {
  const double raw = span / parts;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

}  // namespace

std::string n(double x) {
  if (!std::isfinite(x)) return "0";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", std::round(x * 10) / 10);
  std::string s(b);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s == "-0" ? "0" : s;
}

std::string tolerance_bar(double figure, double tolerance, const std::string& cls) {
  // 150 x 14 (the size is in the CSS): 10 decades below the tolerance to 2 above, ticks every
  // 2 decades from the tolerance down, the tolerance a line at 125.
  const double W = 150, span = 12;
  std::ostringstream o;
  o << "<svg class=\"tb\" data-chart=\"tolerance\" viewBox=\"0 0 150 14\" role=\"img\" aria-label=\""
    << esc(figure_text(figure) + " vs tolerance " + (tolerance == 0 ? std::string("exact") : figure_text(tolerance)))
    << "\"><rect class=\"track\" y=\"4\" width=\"150\" height=\"6\"/>";
  const double f = std::fabs(figure);
  if (tolerance > 0 && std::isfinite(tolerance)) {
    const double lo = std::log10(tolerance) - 10;
    double w = 0;
    if (!std::isfinite(f))
      w = W;
    else if (f > 0)
      w = std::clamp((std::log10(f) - lo) / span * W, 1.5, W);
    o << "<path class=\"tick\" d=\"M0 11v3M25 11v3M50 11v3M75 11v3M100 11v3M150 11v3\"/>";
    if (w > 0)
      o << "<rect class=\"bar " << cls << "\" y=\"4\" width=\"" << n(w) << "\" height=\"6\"/>";
    else
      o << "<circle class=\"dot " << cls << "\" cx=\"3\" cy=\"7\" r=\"2.5\"/>";
    o << "<path class=\"tol\" d=\"M125 0V14\"/>";
  } else if (f == 0) {
    o << "<circle class=\"dot " << cls << "\" cx=\"4\" cy=\"7\" r=\"3\"/>" << text("tv", 11, 11, "= 0 (exact)");
  } else {
    o << "<rect class=\"bar " << cls << "\" y=\"4\" width=\"150\" height=\"6\"/>";
  }
  o << "</svg>";
  return o.str();
}

namespace {

// The profile chart's geometry: margins, the column step, the y range in whole decades.
struct ProfileFrame {
  double step = 0, L = 46, R = 12, T = 22, PH = 150, B = 10, W = 0, H = 0, right = 0, lo = 0, hi = 0;
  bool xlabels = false;
  double y(double v) const {
    if (std::isnan(v) || v <= 0) return T + PH;
    if (std::isinf(v)) return T;
    return T + PH * (hi - std::clamp(std::log10(v), lo, hi)) / (hi - lo);
  }
  double x(size_t i) const { return L + step * (static_cast<double>(i) + 0.5); }
};

ProfileFrame profile_frame(const Profile& p) {
  ProfileFrame f;
  const size_t count = std::max<size_t>(p.labels.size(), 1);
  f.step = std::clamp(900.0 / static_cast<double>(count), 6.0, 24.0);
  f.xlabels = f.step >= 10;
  size_t longest = 0;
  for (const auto& l : p.labels) longest = std::max(longest, l.size());
  if (f.xlabels) f.B = 16 + 6.5 * static_cast<double>(longest);
  f.W = std::max(f.L + f.step * static_cast<double>(count) + f.R, 320.0);
  f.H = f.T + f.PH + f.B;
  f.right = f.W - f.R;
  // The y range: every positive finite value and the tolerance, in whole decades.
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : p.series)
    for (double v : s.values)
      if (std::isfinite(v) && v > 0) lo = std::min(lo, std::log10(v)), hi = std::max(hi, std::log10(v));
  if (p.tolerance > 0) lo = std::min(lo, std::log10(p.tolerance)), hi = std::max(hi, std::log10(p.tolerance));
  if (!std::isfinite(lo)) lo = -1, hi = 0;
  f.lo = std::max(std::floor(lo), -30.0);
  f.hi = std::max(std::ceil(hi), f.lo + 2);
  return f;
}

// Bands: one per run of equal group names, every other one shaded, named on top.
void profile_bands(std::ostringstream& o, const Profile& p, const ProfileFrame& f) {
  std::string names = "<text class=\"gl\" text-anchor=\"middle\">";
  for (size_t a = 0, band = 0; a < p.labels.size(); ++band) {
    size_t b = a;
    while (b < p.labels.size() && p.groups[b] == p.groups[a]) ++b;
    const double x0 = f.L + f.step * static_cast<double>(a), w = f.step * static_cast<double>(b - a);
    if (band % 2 == 1)
      o << "<rect class=\"band\" x=\"" << n(x0) << "\" y=\"" << n(f.T) << "\" width=\"" << n(w) << "\" height=\""
        << n(f.PH) << "\"/>\n";
    std::string name = p.groups[a];
    if (static_cast<double>(name.size()) * 6.2 > w) {  // too wide: "block 12" -> "b12", "embeddings" -> "emb"
      const auto sp = name.find(' ');
      name = sp == std::string::npos ? name.substr(0, std::clamp<size_t>(static_cast<size_t>(w / 6.2), 1, 3))
                                     : name.substr(0, 1) + name.substr(sp + 1);
    }
    names += "<tspan x=\"" + n(x0 + w / 2) + "\" y=\"" + n(f.T - 7) + "\">" + esc(name) + "</tspan>";
    a = b;
  }
  o << names << "</text>\n";
}

// Decade grid and labels (every decade up to 10 of them, else every other or third), the axis,
// the tolerance line.
void profile_axes(std::ostringstream& o, const Profile& p, const ProfileFrame& f) {
  const int decades = static_cast<int>(f.hi - f.lo), every = decades <= 10 ? 1 : decades <= 20 ? 2 : 3;
  std::string grid;
  for (int k = static_cast<int>(f.lo); k <= static_cast<int>(f.hi); ++k)
    grid += "M" + n(f.L) + " " + n(f.y(std::pow(10.0, k))) + "H" + n(f.right);
  o << "<path class=\"grid\" d=\"" << grid << "\"/>\n";
  o << "<text class=\"yl\" text-anchor=\"end\">";
  for (int k = static_cast<int>(f.lo); k <= static_cast<int>(f.hi); k += every)
    o << "<tspan x=\"" << n(f.L - 4) << "\" y=\"" << n(f.y(std::pow(10.0, k)) + 3) << "\">" << decade(k) << "</tspan>";
  o << "</text>\n";
  o << "<path class=\"axis\" d=\"M" << n(f.L) << " " << n(f.T) << "V" << n(f.T + f.PH) << "H" << n(f.right) << "\"/>\n";
  if (p.tolerance > 0) {
    const double yt = f.y(p.tolerance);
    o << "<path class=\"tol\" d=\"M" << n(f.L) << " " << n(yt) << "H" << n(f.right) << "\"/>\n"
      << text("tl", f.right - 2, yt - f.T < 12 ? yt + 11 : yt - 3, "tolerance " + figure_text(p.tolerance), "end")
      << "\n";
  }
}

// Values above the tolerance (a ring under the series' own dots), then each series: its line and
// its dots, in whole pixels, relative to the point before.
void profile_series(std::ostringstream& o, const Profile& p, const ProfileFrame& f) {
  std::string over;
  for (const auto& s : p.series)
    for (size_t i = 0; i < s.values.size() && i < p.labels.size(); ++i) {
      const double v = s.values[i];
      if (!std::isnan(v) && p.tolerance > 0 && v > p.tolerance)
        over += "M" + n(std::round(f.x(i))) + " " + n(std::round(f.y(v))) + "h0";
    }
  if (!over.empty()) o << "<path class=\"over\" d=\"" << over << "\"/>\n";
  for (size_t k = 0; k < p.series.size(); ++k) {
    const auto& s = p.series[k];
    std::string line, dots;
    bool pen = false;
    double px = 0, py = 0;
    for (size_t i = 0; i < s.values.size() && i < p.labels.size(); ++i) {
      if (std::isnan(s.values[i])) {
        pen = false;
        continue;
      }
      const double cx = std::round(f.x(i)), cy = std::round(f.y(s.values[i]));
      const std::string abs = n(cx) + " " + n(cy), rel = n(cx - px) + " " + n(cy - py);
      line += pen ? "l" + rel : "M" + abs;
      dots += (dots.empty() ? "M" + abs : "m" + rel) + "h0";
      pen = true;
      px = cx, py = cy;
    }
    const std::string cls = "s" + std::to_string(k % 8);
    o << "<path class=\"line " << cls << "\" d=\"" << line << "\"/>\n"
      << "<path class=\"dots " << cls << "\" d=\"" << dots << "\"/>\n";
  }
}

// Tensor names read upwards, ending under their point: one text rotated a quarter turn, in
// which (u, v) lands on (v, -u). The same names at the same places in an earlier chart of the
// page: a <use> of those.
void profile_labels(std::ostringstream& o, const Profile& p, const ProfileFrame& f) {
  std::string text = "<text class=\"xl\" text-anchor=\"end\" transform=\"rotate(-90)\">";
  for (size_t i = 0; i < p.labels.size(); ++i)
    text += "<tspan x=\"" + n(-(f.T + f.PH + 5)) + "\" y=\"" + n(f.x(i) + 3) + "\">" + esc(p.labels[i]) + "</tspan>";
  text += "</text>";
  if (!p.shared) {
    o << text << "\n";
  } else if (auto it = p.shared->find(text); it != p.shared->end()) {
    o << "<use class=\"xl\" href=\"#" << it->second << "\"/>\n";  // the clone inherits its style
  } else {
    const std::string id = "xl" + std::to_string(p.shared->size() + 1);
    p.shared->emplace(text, id);
    o << "<g id=\"" << id << "\">" << text << "</g>\n";
  }
}

}  // namespace

std::string profile_chart(const Profile& p) {
  const ProfileFrame f = profile_frame(p);
  std::ostringstream o;
  o << open("chart profile", p.kind, f.W, f.H, p.title) << "\n";
  profile_bands(o, p, f);
  profile_axes(o, p, f);
  profile_series(o, p, f);
  if (f.xlabels) profile_labels(o, p, f);
  o << "</svg>";
  return o.str();
}

std::string bar_panels(const std::string& kind, const std::string& title, const std::vector<Panel>& panels,
                       const std::vector<Row>& rows) {
  const double LW = 200, PW = 150, G = 20, RH = 18, T = 30;
  const double W = LW + static_cast<double>(panels.size()) * (PW + G);
  const double H = T + RH * static_cast<double>(rows.size()) + 6;
  std::ostringstream o;
  o << open("chart bars", kind, W, H, title) << "\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const double yr = T + RH * static_cast<double>(i);
    if (i % 2 == 1)
      o << "<rect class=\"band\" x=\"0\" y=\"" << n(yr) << "\" width=\"" << n(W) << "\" height=\"" << n(RH) << "\"/>\n";
    o << text("rl", LW - 8, yr + RH - 5, rows[i].label, "end") << "\n";
  }
  for (size_t j = 0; j < panels.size(); ++j) {
    const Panel& p = panels[j];
    const double x0 = LW + static_cast<double>(j) * (PW + G), room = PW - 46;
    double max = p.reference > 0 ? p.reference : 0;
    for (const auto& r : rows)
      if (j < r.values.size() && std::isfinite(r.values[j])) max = std::max(max, r.values[j]);
    if (max <= 0) max = 1;
    o << text("pt", x0, 14, p.title) << "\n<path class=\"axis\" d=\"M" << n(x0) << " " << n(T - 4) << "V" << n(H - 4)
      << "\"/>\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const double yr = T + RH * static_cast<double>(i);
      const double v = j < rows[i].values.size() ? rows[i].values[j] : NAN;
      if (!std::isfinite(v)) {
        o << text("bv", x0 + 4, yr + RH - 5, "-") << "\n";
        continue;
      }
      const double w = std::max(v, 0.0) / max * room;
      char value[48];
      std::snprintf(value, sizeof value, p.format, v);
      o << "<rect class=\"hb s" << j % 8 << "\" x=\"" << n(x0) << "\" y=\"" << n(yr + 4) << "\" width=\"" << n(w)
        << "\" height=\"" << n(RH - 8) << "\"/>" << text("bv", x0 + w + 3, yr + RH - 5, value) << "\n";
    }
    if (p.reference > 0) {
      const double xr = x0 + p.reference / max * room;
      o << "<path class=\"ref\" d=\"M" << n(xr) << " " << n(T - 4) << "V" << n(H - 4) << "\"/>"
        << text("rv", xr, T - 6, figure_text(p.reference), "middle") << "\n";
    }
  }
  o << "</svg>";
  return o.str();
}

std::string grouped_bars(const std::string& kind, const std::string& title, const std::vector<Group>& groups,
                         const std::vector<Line>& lines, std::string (*label)(double), double unit) {
  size_t k = 1;
  for (const auto& g : groups) k = std::max(k, g.bars.size());
  const double BW = 7, gw = std::max(static_cast<double>(k) * BW + 14, 46.0);
  const double L = 74, T = 14, PH = 150, B = 32;
  const double W = std::max(L + gw * static_cast<double>(groups.size()) + 8, 420.0), H = T + PH + B, right = W - 8;
  double max = 0;
  for (const auto& g : groups)
    for (double v : g.bars)
      if (std::isfinite(v)) max = std::max(max, v);
  for (const auto& l : lines)
    if (std::isfinite(l.value)) max = std::max(max, l.value);
  if (max <= 0) max = 1;
  const double step = nice_step(max / unit, 4) * unit;
  max = std::max(max * 1.08, step);
  auto y = [&](double v) { return T + PH * (1 - std::clamp(v, 0.0, max) / max); };
  std::ostringstream o;
  o << open("chart grouped", kind, W, H, title) << "\n";
  std::string grid;
  for (double v = 0; v <= max; v += step) grid += "M" + n(L) + " " + n(y(v)) + "H" + n(right);
  o << "<path class=\"grid\" d=\"" << grid << "\"/>\n";
  for (double v = 0; v <= max; v += step) o << text("yl", L - 4, y(v) + 3, label(v), "end") << "\n";
  o << "<path class=\"axis\" d=\"M" << n(L) << " " << n(T) << "V" << n(T + PH) << "H" << n(right) << "\"/>\n";
  std::vector<std::string> bars(k);  // one path per series: "M x top h w V bottom h -w z" per bar
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& g = groups[gi];
    const double x0 = L + gw * static_cast<double>(gi) + (gw - BW * static_cast<double>(k)) / 2;
    for (size_t b = 0; b < g.bars.size(); ++b)
      if (std::isfinite(g.bars[b]))
        bars[b] += "M" + n(x0 + BW * static_cast<double>(b)) + " " + n(y(g.bars[b])) + "h" + n(BW - 1) + "V" +
                   n(T + PH) + "h" + n(1 - BW) + "z";
    // "rank 0|short": two lines under the group.
    const auto bar = g.label.find('|');
    const double cx = x0 + BW * static_cast<double>(k) / 2;
    o << text("xl", cx, T + PH + 12, g.label.substr(0, bar), "middle");
    if (bar != std::string::npos) o << text("xl", cx, T + PH + 23, g.label.substr(bar + 1), "middle");
    o << "\n";
  }
  for (size_t b = 0; b < k; ++b)
    if (!bars[b].empty()) o << "<path class=\"vb s" << b % 8 << "\" d=\"" << bars[b] << "\"/>\n";
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    const double yl = y(l.value);
    o << "<path class=\"ref " << l.cls << "\" d=\"M" << n(L) << " " << n(yl) << "H" << n(right) << "\"/>"
      << (i % 2 == 0 ? text("rl " + l.cls, right - 2, yl - 3, l.label + " " + label(l.value), "end")
                     : text("rl " + l.cls, L + 4, yl - 3, l.label + " " + label(l.value), "start"))  // the next: left
      << "\n";
  }
  o << "</svg>";
  return o.str();
}

}  // namespace gradcert::reports::svg
