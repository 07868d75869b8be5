#include "reports/findings.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>

#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"

namespace gradcert {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json read_json(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not JSON: " + e.what());
  }
}

std::string first_line(const std::string& s, size_t max = 240) {
  std::string l = s.substr(0, s.find('\n'));
  if (l.size() > max) l = l.substr(0, max) + "...";
  return l;
}

double number(const json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {  // json_number's "nan" / "inf"
    const std::string s = j.get<std::string>();
    return s == "inf" ? 1.0 / 0.0 : s == "-inf" ? -1.0 / 0.0 : 0.0 / 0.0;
  }
  return 0;
}

// NOTE [partial window findings] What a stack did with the plan's partial final window, from
// the diagnosis of that update (taken at the stack's own parameters, so valid even after an
// earlier update diverged) and the ledger: global-mean there = correct; drop-partial-window
// = dropped; partial-nominal-accum or micro-mean = each microbatch's mean over the nominal A;
// a ledger failure adds the examples the stack really used (e.g. padded with duplicates).
std::string partial_kind_of(const std::string& best) {
  if (best == "global-mean") return "correct";
  if (best == "drop-partial-window") return "dropped";
  if (best == "partial-nominal-accum" || best == "micro-mean") return "divided by the nominal A";
  if (best.empty()) return "unknown";
  return best;
}

void judge(Finding& f, const json& report) {
  if (!report.contains("runs") || !report["runs"].is_array() || report["runs"].empty())
    throw std::runtime_error("no runs");
  const json& run = report["runs"][0];
  f.verdict = run.value("verdict", std::string("fail"));
  if (run.contains("error")) {
    f.verdict = "error";
    f.reason = first_line(run["error"].get<std::string>());
  }
  for (const auto& c : run.value("checks", json::array()))
    f.checks.push_back({c.value("id", ""), c.value("verdict", ""), c.value("detail", ""),
                        number(c.value("figure", json(0))), number(c.value("tolerance", json(0)))});
  const std::string run_dir = run.value("run_dir", std::string());
  std::vector<int> partial;
  if (!run_dir.empty() && fs::exists(run_dir + "/plan.json")) {
    const json plan = read_json(run_dir + "/plan.json");
    for (const auto& w : plan.value("windows", json::array()))
      if (w.value("partial", false)) partial.push_back(w.value("update", -1));
  }
  json manifest;
  if (!run_dir.empty() && fs::exists(run_dir + "/manifest.json")) manifest = read_json(run_dir + "/manifest.json");
  if (manifest.is_object()) {
    f.notes = manifest.value("notes", json("")).is_string() ? manifest.value("notes", std::string()) : "";
    // What really ran (the shim's versions.stack_version, e.g. "transformers 4.45.2").
    const json v = manifest.value("versions", json::object());
    if (v.contains("stack_version") && v["stack_version"].is_string())
      f.version = v["stack_version"].get<std::string>();
  }
  if (run.contains("diagnosis")) {
    const json& d = run["diagnosis"];
    // Matched within the tolerance, or separated (NOTE [separated diagnosis]): then the figure says how close.
    const std::string best_id = d.contains("best") ? d["best"].value("id", "") : "";
    if (d.value("matched", false))
      f.diagnosis = best_id;
    else if (d.value("separated", false))
      f.diagnosis = best_id + " (~" + figure_text(number(d["best"].value("figure", json(0)))) + ")";
    else
      f.diagnosis = "unexplained";
    f.diagnosis_note = d.value("note", "");
    for (const auto& u : d.value("per_update", json::array()))
      f.per_update.push_back({u.value("update", -1), u.value("best", "")});
    // NOTE [composed diagnosis] A stack can be wrong twice: one objective on the full windows
    // and another thing in the partial one (DeepSpeed: micro-mean, then the partial window
    // dropped). No single candidate matches every update then, but each update matches one:
    // the full windows' common objective is the diagnosis, the partial window its own column.
    if (f.diagnosis == "unexplained") {
      double tol = 0;
      for (const auto& c : run.value("checks", json::array()))
        if (c.value("id", "") == "grad.parity") tol = number(c.value("tolerance", json(0)));
      std::string common;
      bool agree = true;
      for (const auto& u : d.value("per_update", json::array())) {
        const int upd = u.value("update", -1);
        if (std::find(partial.begin(), partial.end(), upd) != partial.end()) continue;
        const std::string b = u.value("best", "");
        agree = agree && number(u.value("figure", json(1))) <= tol && (common.empty() || common == b);
        common = b;
      }
      if (agree && !common.empty()) f.diagnosis = common + " (full windows)";
    }
  }
  // The N count: unshifted when the objective counted one extra target per row.
  const std::string best = f.diagnosis;
  f.n_count = best.find("unshifted") != std::string::npos ? "unshifted"
              : best.empty() || best == "unexplained"     ? "unknown"
                                                          : "shifted";
  // The partial final window.
  for (int p : partial) {
    std::string here;
    for (const auto& [u, b] : f.per_update)
      if (u == p) here = b;
    bool no_step = false;
    if (manifest.is_object() && manifest.contains("updates") && static_cast<size_t>(p) < manifest["updates"].size())
      no_step = manifest["updates"][p].value("no_step", false);
    std::string kind = no_step ? "dropped" : partial_kind_of(here);
    std::string text = kind + " (update " + std::to_string(p) + ")";
    for (const auto& c : f.checks)
      if (c.id == "batch.sample_ledger" && c.verdict == "fail") {
        kind += ", examples differ";
        text += "; examples: " + first_line(c.detail, 200);
      }
    f.partial_kind = f.partial_kind.empty() ? kind : f.partial_kind + "; " + kind;
    f.partial_window = f.partial_window.empty() ? text : f.partial_window + "; " + text;
  }
  if (partial.empty()) f.partial_kind = f.partial_window = "no partial window in the plan";
}

}  // namespace

std::vector<Finding> read_findings(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir + "/entries", ec))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  if (ec) throw std::runtime_error(dir + "/entries: cannot be read: " + ec.message());
  std::sort(files.begin(), files.end());
  std::vector<Finding> out;
  for (const auto& path : files) {
    const json e = read_json(path);
    Finding f;
    try {
      f.id = e.at("id").get<std::string>();
      f.stack = e.at("stack").get<std::string>();
      f.config = e.at("config").get<std::string>();
      f.env = e.value("env", "");
      f.dtype = e.value("dtype", "");
      f.world = e.value("world", 0);
      f.tp = e.value("tp", 1);
      f.pp = e.value("pp", 1);
      f.exit_code = e.value("exit", 0);
      f.seconds = e.value("seconds", 0.0);
    } catch (const json::exception& x) {
      throw std::runtime_error(path + ": " + x.what());
    }
    if (e.contains("skip") && e["skip"].is_string()) {
      f.verdict = "skip";
      f.reason = first_line(e["skip"].get<std::string>());
    } else {
      const std::string report = e.value("out", std::string()) + "/report.json";
      try {
        judge(f, read_json(report));
        if (f.verdict == "pass" && f.exit_code != 0) f.verdict = "fail";  // never a pass the run did not give
      } catch (const std::exception& x) {
        f.verdict = "error";
        f.reason = "exit " + std::to_string(f.exit_code) + ": " + first_line(e.value("error", std::string(x.what())));
      }
    }
    if (f.version.empty()) f.version = e.value("version", "");
    out.push_back(std::move(f));
  }
  return out;
}

namespace {

const FindingCheck* check_of(const Finding& f, const std::string& id) {
  for (const auto& c : f.checks)
    if (c.id == id) return &c;
  return nullptr;
}

std::string figure_cell(const Finding& f, const std::string& id) {
  const FindingCheck* c = check_of(f, id);
  if (!c) return "-";
  if (c->verdict == "skip") return "skip";
  return figure_text(c->figure) + (c->verdict == "pass" ? "" : " FAIL");
}

const char* kFigureChecks[] = {"batch.sample_ledger", "targets.window_count", "grad.parity", "grad.scale",
                               "params.parity"};

}  // namespace

std::string findings_json(const std::vector<Finding>& all) {
  json entries = json::array();
  for (const auto& f : all) {
    json checks = json::array();
    for (const auto& c : f.checks)
      checks.push_back({{"id", c.id},
                        {"verdict", c.verdict},
                        {"figure", json_number(c.figure)},
                        {"tolerance", json_number(c.tolerance)},
                        {"detail", c.detail}});
    json per = json::array();
    for (const auto& [u, b] : f.per_update) per.push_back({{"update", u}, {"best", b}});
    entries.push_back({{"id", f.id},
                       {"stack", f.stack},
                       {"version", f.version},
                       {"config", f.config},
                       {"env", f.env},
                       {"dtype", f.dtype},
                       {"world", f.world},
                       {"tp", f.tp},
                       {"pp", f.pp},
                       {"verdict", f.verdict},
                       {"reason", f.reason.empty() ? json(nullptr) : json(f.reason)},
                       {"diagnosis", f.diagnosis.empty() ? json(nullptr) : json(f.diagnosis)},
                       {"diagnosis_note", f.diagnosis_note},
                       {"per_update", per},
                       {"partial_window", f.partial_window},
                       {"n_count", f.n_count},
                       {"notes", f.notes},
                       {"checks", checks},
                       {"seconds", f.seconds},
                       {"exit", f.exit_code}});
  }
  return json{{"schema", "gradcert.findings/1"}, {"entries", entries}}.dump(1) + "\n";
}

std::string findings_console(const std::vector<Finding>& all) {
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof line, "#%-22s %-20s %-13s %-7s %-22s %-11s %-10s %-10s %-10s %s\n", "stack/config",
                "version", "world", "verdict", "diagnosis", "ledger", "N", "grad.parity", "grad.scale",
                "partial window");
  o << "# gradcert certify-stacks: what each real stack computed (float64 reference; --sampler-audit)\n" << line;
  for (const auto& f : all) {
    const std::string topo = std::to_string(f.world) + (f.tp > 1 ? " tp" + std::to_string(f.tp) : "") +
                             (f.pp > 1 ? " pp" + std::to_string(f.pp) : "") + " " + f.dtype;
    std::snprintf(line, sizeof line, " %-22s %-20s %-13s %-7s %-22s %-11s %-10s %-10s %-10s %s\n", f.id.c_str(),
                  f.version.c_str(), topo.c_str(), f.verdict.c_str(), f.diagnosis.empty() ? "-" : f.diagnosis.c_str(),
                  figure_cell(f, "batch.sample_ledger").c_str(), figure_cell(f, "targets.window_count").c_str(),
                  figure_cell(f, "grad.parity").c_str(), figure_cell(f, "grad.scale").c_str(), f.partial_kind.c_str());
    o << line;
    if (!f.reason.empty()) o << "   " << f.verdict << ": " << f.reason << "\n";
  }
  return o.str();
}

std::string findings_markdown(const std::vector<Finding>& all) {
  std::ostringstream o;
  o << "# What gradcert finds in real stacks\n\n"
    << "Each row: the stack's own training code path, fed the plan's examples through its own data path "
       "(`--sampler-audit`), held to the float64 one-process reference. **Diagnosis**: the objective the "
       "stack's gradient matches, judged at every update from the stack's own parameters. **N**: whether the "
       "token count the objective divides by is taken on shifted targets.\n\n"
    << "| stack / config | version | world | verdict | diagnosis | partial final window | N |";
  for (const char* c : kFigureChecks) o << " " << c << " |";
  o << "\n|---|---|---|---|---|---|---|";
  for (size_t i = 0; i < sizeof kFigureChecks / sizeof *kFigureChecks; ++i) o << "---|";
  o << "\n";
  for (const auto& f : all) {
    o << "| " << f.id << " | " << f.version << " | " << f.world
      << (f.tp > 1 ? " (tp " + std::to_string(f.tp) + ")" : "")
      << (f.pp > 1 ? " (pp " + std::to_string(f.pp) + ")" : "") << " " << f.dtype << " | **" << f.verdict << "** | "
      << (f.diagnosis.empty() ? "-" : f.diagnosis) << " | " << f.partial_window << " | " << f.n_count << " |";
    for (const char* c : kFigureChecks) o << " " << figure_cell(f, c) << " |";
    o << "\n";
  }
  o << "\n## Details\n";
  for (const auto& f : all) {
    o << "\n### " << f.id << " (" << f.version << ")\n\n- verdict: **" << f.verdict << "**"
      << (f.reason.empty() ? "" : " — " + f.reason) << "\n";
    if (!f.diagnosis_note.empty()) o << "- diagnosis: " << f.diagnosis_note << "\n";
    if (!f.notes.empty()) o << "- stack facts (the shim's notes): " << f.notes << "\n";
    for (const auto& c : f.checks)
      o << "- `" << c.id << "` " << c.verdict << " " << figure_text(c.figure) << ": " << c.detail << "\n";
  }
  return o.str();
}

std::string findings_golden(const std::vector<Finding>& all) {
  std::ostringstream o;
  for (const auto& f : all) {
    o << f.id << " | " << f.version << " | " << f.verdict;
    if (f.verdict == "skip" || f.verdict == "error") {
      o << " | " << f.reason << "\n";
      continue;
    }
    // The separated figure ("(~3.34e-08)", the stack's own rounding) is not approved: its
    // last digits may move with a library's kernels; that the objective is separated is.
    std::string diag = f.diagnosis.empty() ? "-" : f.diagnosis;
    if (auto at = diag.find(" (~"); at != std::string::npos) diag = diag.substr(0, at) + " (separated)";
    o << " | diagnosis " << diag << " | partial " << f.partial_kind << " | N " << f.n_count << " |";
    for (const auto& c : f.checks) o << " " << c.id << "=" << c.verdict;
    o << "\n";
  }
  return o.str();
}

}  // namespace gradcert
