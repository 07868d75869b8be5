#include "conformance/certify.hpp"

#include <chrono>
#include <ctime>
#include <filesystem>

#include "backends/registry.hpp"

namespace gradcert {

namespace fs = std::filesystem;

std::vector<RunRequest> certify_matrix(const CertifyOptions& o) {
  std::vector<RunRequest> out;
  auto add = [&](const std::string& backend, int world, const std::string& optimizer, DType dtype,
                 const std::string& inject) {
    RunRequest r;
    r.spec = o.spec;
    r.spec.optimizer.name = optimizer;
    r.spec.dtype = dtype;
    r.backend = backend;
    r.world = world;
    r.launcher = o.launcher;
    r.inject = inject;
    r.exe = o.exe;
    r.run_dir = o.out_dir + "/runs/" + run_dir_name(r);
    out.push_back(r);
  };
  const std::string base_opt = o.spec.optimizer.name;
  const std::string other_opt = base_opt == "sgd" ? "adamw" : "sgd";
  const std::vector<std::pair<std::string, int>> cases = {{"single", 1}, {"ddp", 2}, {"ddp", 3}};
  for (const auto& [b, w] : cases) add(b, w, base_opt, o.spec.dtype, "");
  for (const auto& [b, w] : cases) add(b, w, other_opt, o.spec.dtype, "");
  if (o.spec.dtype == DType::Float64) {
    add("single", 1, base_opt, DType::Float32, "");
    add("ddp", 2, base_opt, DType::Float32, "");
  }
  if (o.mutants)
    for (const auto& [b, w] : std::vector<std::pair<std::string, int>>{{"single", 1}, {"ddp", 2}})
      for (const auto& m : mutant_names(b)) add(b, w, base_opt, o.spec.dtype, m);
  return out;
}

Report run_certify(const CertifyOptions& o, std::ostream& progress) {
  Report report;
  const auto requests = certify_matrix(o);
  int max_world = 1;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& req = requests[i];
    RunReport r = run_backend(req);
    max_world = std::max(max_world, r.topology.world());
    const bool good = req.inject.empty() ? r.passed() : (r.error.empty() && !r.detected_by().empty());
    char line[256];
    std::snprintf(line, sizeof line, "# [%2zu/%zu] %-6s world %d %-8s %-5s %-29s %s (%.1f s)\n", i + 1,
                  requests.size(), req.backend.c_str(), r.topology.world(), r.dtype.c_str(), r.optimizer.c_str(),
                  req.inject.empty() ? "" : ("inject " + req.inject).c_str(),
                  req.inject.empty() ? (good ? "pass" : "FAIL") : (good ? "caught" : "NOT CAUGHT"), r.wall_seconds);
    progress << line << std::flush;
    report.runs.push_back(std::move(r));
  }
  report.spec_json = spec_to_json(o.spec);
  report.environment = make_environment(o.spec.seed, max_world, o.launcher);
  return report;
}

std::string new_report_dir(const std::string& root) {
  std::time_t now = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  fs::create_directories(root);
  std::string name = ts;
  for (int k = 1; fs::exists(root + "/" + name); ++k) name = std::string(ts) + "-" + std::to_string(k);
  fs::create_directories(root + "/" + name);
  const fs::path latest = root + "/latest";
  std::error_code ec;
  fs::remove(latest, ec);
  fs::create_directory_symlink(name, latest, ec);
  return root + "/" + name;
}

std::string run_dir_name(const RunRequest& r) {
  const Spec s = effective_spec(r);
  std::string n = r.backend + "-w" + std::to_string(s.topology.world()) + "-" + dtype_name(s.dtype) + "-" +
                  s.optimizer.name;
  if (!r.inject.empty()) n += "-" + r.inject;
  return n;
}

}  // namespace gradcert
