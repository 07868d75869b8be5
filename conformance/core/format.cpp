#include "conformance/core/format.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gradcert {

nlohmann::json json_number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

std::string figure_text(double x) {
  if (std::isinf(x)) return "inf";
  if (std::isnan(x)) return "nan";
  char b[32];
  if (x == std::floor(x) && std::fabs(x) < 1e9)
    std::snprintf(b, sizeof b, "%.0f", x);
  else
    std::snprintf(b, sizeof b, "%.2e", x);
  return b;
}

std::string g3_text(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\n' && ch != '\t')
          o += ' ';
        else
          o += ch;
    }
  return o;
}

std::string exact_text(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", x);
  return b;
}

std::string quoted_excerpt(const std::string& s, size_t max) {
  if (s.size() <= max) return "'" + s + "'";
  return "'" + s.substr(0, max) + "...' (" + std::to_string(s.size()) + " bytes)";
}

std::string human_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024 && u < 5) v /= 1024, ++u;
  char b[48];
  if (u == 0)
    std::snprintf(b, sizeof b, "%.0f B", v);
  else
    std::snprintf(b, sizeof b, "%.2f %s", v, units[u]);
  return b;
}

std::string sci(double x) {
  char b[48];
  std::snprintf(b, sizeof b, "%.4e", x);
  std::string s(b);
  const auto e = s.find('e');
  std::string mant = s.substr(0, e), exp = s.substr(e + 1);
  if (mant.find('.') != std::string::npos) {
    while (mant.back() == '0') mant.pop_back();
    if (mant.back() == '.') mant.pop_back();
  }
  const bool neg = exp[0] == '-';
  exp = exp.substr(1);
  while (exp.size() > 1 && exp[0] == '0') exp.erase(0, 1);
  return mant + "e" + (neg ? "-" : "") + exp;
}
std::string shell_word(const std::string& s) {
  const bool safe = !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || std::string("-_./=:+,@%").find(static_cast<char>(c)) != std::string::npos;
  });
  if (safe) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace gradcert
