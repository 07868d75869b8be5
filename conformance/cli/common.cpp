#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "conformance/cli/verbs.hpp"
#include "conformance/launch/cuda_probe.hpp"
#include "conformance/run/certify.hpp"
#include "reports/report.hpp"

namespace gradcert {

Spec spec_from(const std::string& path) { return path.empty() ? Spec{} : load_spec(path); }

Spec spec_with_overrides(const CommonOptions& o) {
  Spec s = spec_from(o.spec_path);
  if (!o.dtype.empty()) {
    try {
      s.dtype = parse_dtype(o.dtype);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--dtype: ") + e.what());
    }
  }
  if (!o.optimizer.empty()) s.optimizer.name = o.optimizer;
  if (!o.device_resolved.empty()) s.device = o.device_resolved;
  return s;
}

void resolve_device_option(int argc, char** argv, CommonOptions& o) {
  const std::string verb = argc > 1 ? argv[1] : "";
  if (verb != "run" && verb != "certify" && verb != "audit" && verb != "observe") return;
  std::string device, spec_path;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;  // the job's own options are not gradcert's
    if (a == "--device" && i + 1 < argc) device = argv[i + 1];
    if (a.rfind("--device=", 0) == 0) device = a.substr(9);
    if (a == "--spec" && i + 1 < argc) spec_path = argv[i + 1];
    if (a.rfind("--spec=", 0) == 0) spec_path = a.substr(7);
  }
  std::string what = "--device";
  if (device.empty() && !spec_path.empty()) {
    try {
      device = load_spec(spec_path).device;  // a bad spec is reported by the verb, as before
      what = spec_path + ": device";
    } catch (const std::exception&) {}
  }
  if (device.empty()) device = "cpu";
  o.device_resolved = resolve_device(device, what);
  if (device == "auto") std::cerr << "gradcert: --device auto: " << o.device_resolved << "\n";
}

void add_device_option(CLI::App* cmd, CommonOptions& o) {
  cmd->add_option("--device", o.device,
                  "cpu | cuda | auto: where the ranks compute (default: the spec's device, cpu); cuda where CUDA "
                  "cannot serve exits 2 naming why, before anything runs (NOTE [device])")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
}

LauncherKind launcher_from(const std::string& name) {
  if (name == "local") return LauncherKind::Local;
  if (name == "mpirun") return LauncherKind::Mpirun;
  throw std::invalid_argument("--launcher: unknown launcher '" + name + "' (expected local or mpirun)");
}

// NOTE [stale report] A run into an --out folder that holds an earlier report removes that
// report first, before anything can fail: a failure that writes no report (bad input, exit 2)
// must not leave a passing report.json / junit.xml there for CI to read.
void clear_previous_report(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const char* name : {"report.json", "report.md", "junit.xml", "report.html", "audit.json", "audit.md"}) {
    std::error_code ec;
    const fs::path p = fs::path(dir) / name;
    if (!fs::is_regular_file(fs::symlink_status(p, ec))) continue;  // none (or not gradcert's file)
    if (!fs::remove(p, ec) && ec)
      throw std::invalid_argument("--out: cannot remove the earlier " + p.string() + ": " + ec.message());
  }
}

// FILE.py:FUNC relative to where gradcert was started: the runner and the stack run elsewhere.
std::string absolute_factory(const std::string& model) {
  const auto colon = model.rfind(':');
  std::error_code ec;
  if (colon != std::string::npos && colon > 3 && model.compare(colon - 3, 3, ".py") == 0 &&
      std::filesystem::exists(model.substr(0, colon), ec))
    return std::filesystem::absolute(model.substr(0, colon), ec).string() + model.substr(colon);
  return model;
}

std::string report_dir(const CommonOptions& o) { return o.out.empty() ? new_report_dir("reports/out") : o.out; }

std::string interrupted_line(int sig) {
  return "# INTERRUPTED by " + signal_text(sig) +
         ": every rank and every process the command started was stopped; this report is partial\n";
}

int finish_audit(AuditReport& a, const std::string& dir) {
  if (!a.interrupted) a.interrupted = interrupt_signal();  // during the comparison (NOTE [interrupt])
  std::cout << audit_table(a);
  if (a.interrupted) std::cout << interrupted_line(a.interrupted);
  write_audit_files(a, dir);
  std::cout << "# report: " << dir << "/audit.json (also audit.md, junit.xml, report.html)\n";
  if (a.interrupted) return 128 + a.interrupted;
  return a.run_failed() ? kBadInput : a.preserved() ? kPass : kCheckFailed;
}

int finish(const Report& finished, const std::string& dir) {
  Report report = finished;
  report.interrupted = interrupt_signal();  // NOTE [interrupt]
  std::cout << report_table(report);
  if (report.interrupted) std::cout << interrupted_line(report.interrupted);
  write_report_files(report, dir);
  std::cout << "# report: " << dir << "/report.json (also report.md, junit.xml, report.html)\n";
  if (report.interrupted) return 128 + report.interrupted;
  for (const auto& r : report.runs)
    if (!r.error.empty()) return kBadInput;
  return report.passed() ? kPass : kCheckFailed;
}

}  // namespace gradcert
