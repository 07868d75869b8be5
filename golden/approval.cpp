#include "golden/approval.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

namespace gradcert::golden {

std::string golden_dir() { return GRADCERT_GOLDEN_DIR; }

std::string mask_volatile(const std::string& text) {
  static const std::regex time(R"(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?)");
  // A path does not hold '<' or '>', so an XML element's "/>" stays as it is.
  static const std::regex path(R"((^|[\s'"=(])/[^\s'")<>]+)");
  static const std::regex version(R"(\b[vV]?\d+\.\d+\.\d+([.+-][A-Za-z0-9.+-]*)?)");
  std::string out = std::regex_replace(text, time, "<time>");
  out = std::regex_replace(out, path, "$1<path>");
  return std::regex_replace(out, version, "<version>");
}

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> split_tokens(const std::string& line) {
  std::vector<std::string> tokens;
  std::istringstream in(line);
  for (std::string t; in >> t;) tokens.push_back(t);
  return tokens;
}

bool as_float(const std::string& token, double& value) {
  if (token.find_first_of(".eE") == std::string::npos) return false;
  char* end = nullptr;
  value = std::strtod(token.c_str(), &end);
  return end && *end == '\0' && end != token.c_str();
}

// NOTE [golden numbers] Goldens hold reference figures at full precision (%.17g). The same
// float64 computation can differ in the last bits across BLAS builds and thread counts, so
// floating-point tokens are compared within the float64 parity tolerance (1e-10 relative,
// the figure every check uses) rather than as text; integers (N, shapes, counts) and every
// other token must match exactly. Exact zeros stay exact.
bool tokens_agree(const std::string& a, const std::string& b, double relative) {
  if (a == b) return true;
  double x = 0, y = 0;
  if (!as_float(a, x) || !as_float(b, y)) return false;
  return std::abs(x - y) <= relative * std::max(std::abs(x), std::abs(y));
}

}  // namespace

bool texts_agree(const std::string& approved, const std::string& actual, double relative, std::string* diff) {
  const auto a = split_lines(approved), b = split_lines(actual);
  bool same = true;
  std::ostringstream d;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string* la = i < a.size() ? &a[i] : nullptr;
    const std::string* lb = i < b.size() ? &b[i] : nullptr;
    bool line_same = la && lb;
    if (line_same) {
      const auto ta = split_tokens(*la), tb = split_tokens(*lb);
      line_same = ta.size() == tb.size();
      for (size_t k = 0; line_same && k < ta.size(); ++k) line_same = tokens_agree(ta[k], tb[k], relative);
    }
    if (line_same) continue;
    same = false;
    d << "@@ line " << i + 1 << " @@\n";
    if (la) d << "-" << *la << "\n";
    if (lb) d << "+" << *lb << "\n";
  }
  if (diff) *diff = d.str();
  return same;
}

::testing::AssertionResult matches_golden(const std::string& name, const std::string& actual, double relative) {
  namespace fs = std::filesystem;
  const fs::path golden = fs::path(golden_dir()) / (name + ".golden.txt");
  const fs::path unapproved = fs::path(golden_dir()) / (name + ".unapproved.txt");
  const std::string masked = mask_volatile(actual);
  std::string approved;
  const bool exists = fs::exists(golden);
  if (exists) {
    std::ifstream in(golden);
    std::ostringstream s;
    s << in.rdbuf();
    approved = s.str();
  }
  std::string diff;
  if (exists && texts_agree(approved, masked, relative, &diff)) {
    std::error_code ignored;
    fs::remove(unapproved, ignored);
    return ::testing::AssertionSuccess();
  }
  std::ofstream(unapproved) << masked;
  std::ostringstream msg;
  if (!exists)
    msg << "no approved golden " << golden.string() << " yet; wrote " << unapproved.string() << ":\n" << masked;
  else
    msg << "golden " << name << " differs from " << golden.string() << " (numbers within " << relative
        << " relative agree):\n"
        << diff << "wrote " << unapproved.string();
  msg << "\nreview it, then approve with: scripts/approve-goldens " << name;
  return ::testing::AssertionFailure() << msg.str();
}

}  // namespace gradcert::golden
