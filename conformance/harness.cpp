#include "conformance/harness.hpp"

#include <torch/version.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "backends/backend.hpp"
#include "conformance/artifacts.hpp"
#include "conformance/reference.hpp"

namespace gradcert {

namespace fs = std::filesystem;

Spec effective_spec(const RunRequest& req) {
  Spec s = req.spec;
  if (req.tp > 0) s.topology.tp = req.tp;
  if (req.pp > 0) s.topology.pp = req.pp;
  if (req.world > 0) s.topology.dp = data_parallel_degree(req.world, s.topology.tp, s.topology.pp);
  validate_spec(s);
  return s;
}

RunReport run_backend(const RunRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  const Spec spec = effective_spec(req);
  const Plan plan = make_plan(spec);
  const int world = plan.world();
  auto backend = make_backend(req.backend);
  backend->validate(plan, world, req.inject);

  RunReport report;
  report.backend = req.backend;
  report.topology = spec.topology;
  report.dtype = dtype_name(spec.dtype);
  report.optimizer = spec.optimizer.name;
  report.inject = req.inject;
  report.updates = static_cast<int>(plan.windows.size());
  report.update_batch = plan.update_batch;
  report.run_dir = req.run_dir;

  fs::create_directories(req.run_dir);
  write_file_atomic(req.run_dir + "/spec.json", spec_to_json(spec));
  write_file_atomic(req.run_dir + "/plan.json", plan_to_json(plan, spec));

  LaunchRequest launch_req;
  launch_req.kind = req.launcher;
  launch_req.world = world;
  launch_req.argv = {req.exe, "worker", "--run-dir", req.run_dir, "--backend", req.backend,
                     "--port", std::to_string(free_local_port())};
  if (!req.inject.empty()) launch_req.argv.insert(launch_req.argv.end(), {"--inject", req.inject});
  launch_req.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec.timeout.run_s * 1000));
  launch_req.log_dir = req.run_dir;
  const LaunchResult launched = launch(launch_req);

  if (!launched.ok) {
    report.error = launched.message;
  } else {
    const auto reference = run_reference(spec, plan);
    try {
      const auto artifacts = read_run(req.run_dir, plan, world, reference.front().grads, spec.dtype);
      report.checks = run_checks(plan, spec.dataset.size, reference, artifacts, spec.parity_tolerance());
    } catch (const ArtifactError& e) {
      report.error = std::string("bad artifacts: ") + e.what();
    }
  }
  report.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("gradcert") : p.string();
}

Environment make_environment(uint64_t seed, int world, LauncherKind launcher) {
  Environment e;
  e.torch = TORCH_VERSION;
  e.device = "cpu";
  e.world = world;
  e.launcher = launcher == LauncherKind::Mpirun ? "mpirun" : "local";
  e.seed = seed;
  e.git = "unknown";
  if (FILE* p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r")) {
    std::array<char, 64> buf{};
    if (fgets(buf.data(), buf.size(), p)) {
      e.git = buf.data();
      while (!e.git.empty() && (e.git.back() == '\n' || e.git.back() == '\r')) e.git.pop_back();
    }
    pclose(p);
  }
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) == 0) e.host = host.data();
  std::time_t now = std::time(nullptr);
  std::array<char, 32> ts{};
  std::strftime(ts.data(), ts.size(), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  e.started = ts.data();
  return e;
}

}  // namespace gradcert
