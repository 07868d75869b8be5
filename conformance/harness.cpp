#include "conformance/harness.hpp"

#include <torch/version.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "backends/backend.hpp"
#include <nlohmann/json.hpp>

#include "conformance/artifacts.hpp"
#include "conformance/dataset.hpp"
#include "conformance/model.hpp"
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

namespace {

// The examples each update really consumed (one record per DP rank, in rank and
// microstep order), as a plan the reference can run: the sampler audit's reference.
Plan plan_from_consumed(const Spec& spec, const Plan& planned, const std::vector<BackendUpdate>& run) {
  Plan p = planned;
  std::vector<int64_t> targets(spec.dataset.size, -1);
  for (size_t u = 0; u < run.size() && u < p.windows.size(); ++u) {
    Window& w = p.windows[u];
    w.ids.clear();
    w.valid_targets = 0;
    std::map<int, const RankRecord*> replicas;
    for (const auto& r : run[u].ranks) replicas.emplace(r.dp_rank, &r);
    for (auto& [dp, rec] : replicas)
      for (const auto& mb : rec->consumed)
        for (auto id : mb) {
          if (id < 0 || id >= spec.dataset.size)
            throw ArtifactError("rank " + std::to_string(rec->rank) + " reported sample id " + std::to_string(id) +
                                " outside the dataset");
          if (targets[id] < 0) targets[id] = make_sample(spec, id).valid_targets();
          w.ids.push_back(id);
          w.valid_targets += targets[id];
        }
  }
  return p;
}

void write_external_inputs(const Spec& spec, const std::string& dir) {
  nlohmann::json samples = nlohmann::json::array();
  for (int64_t id = 0; id < spec.dataset.size; ++id) {
    const Sample s = make_sample(spec, id);
    samples.push_back({{"id", id}, {"tokens", s.tokens}, {"labels", s.labels}});
  }
  nlohmann::json j = {{"schema", "gradcert.dataset/1"}, {"ignore_index", kIgnoreIndex}, {"pad_token", kPadToken},
                      {"samples", samples}};
  write_file_atomic(dir + "/dataset.json", j.dump());
  write_safetensors(dir + "/initial.safetensors", initial_params(spec), {{"schema", "gradcert.initial/1"}});
}

}  // namespace

RunReport run_backend(const RunRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  const Spec spec = effective_spec(req);
  const Plan plan = make_plan(spec);
  const int world = plan.world();
  const bool external = req.backend == kExternalBackend;
  if (external) {
    if (req.command.empty()) throw std::invalid_argument("--backend external needs --command \"<launch command>\"");
    if (!req.inject.empty()) throw std::invalid_argument("--inject applies to built-in backends only");
  } else {
    if (req.sampler_audit) throw std::invalid_argument("--sampler-audit applies to --backend external only");
    auto backend = make_backend(req.backend);
    backend->validate(plan, world, req.inject);
    backend->validate_model(spec.model, plan);
  }

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
  if (external) {
    // One launcher process runs the command; the stack starts its own ranks (e.g. torchrun).
    write_external_inputs(spec, req.run_dir);
    launch_req.kind = LauncherKind::Local;
    launch_req.world = 1;
    launch_req.argv = {"/bin/sh", "-c", req.command};
    launch_req.env = {{"GRADCERT_RUN_DIR", req.run_dir},
                      {"GRADCERT_PLAN", req.run_dir + "/plan.json"},
                      {"GRADCERT_DATASET", req.run_dir + "/dataset.json"},
                      {"GRADCERT_INIT", req.run_dir + "/initial.safetensors"},
                      {"GRADCERT_OUT", req.run_dir},
                      {"GRADCERT_NPROC", std::to_string(world)},
                      {"GRADCERT_MASTER_PORT", std::to_string(free_local_port())},
                      {"GRADCERT_SAMPLER", req.sampler_audit ? "own" : "plan"}};
  }
  launch_req.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec.timeout.run_s * 1000));
  launch_req.log_dir = req.run_dir;
  const LaunchResult launched = launch(launch_req);

  if (!launched.ok) {
    report.error = launched.message;
    if (external) {  // one launched process: the command, not a rank
      for (auto [from, to] : {std::pair<std::string, std::string>{"rank 0 ", "the external command "},
                              {"--- rank 0 log tail ---", "--- external command output (tail) ---"}})
        if (auto at = report.error.find(from); at != std::string::npos) report.error.replace(at, from.size(), to);
    }
  } else {
    try {
      const TensorMap shapes = initial_params(spec);
      const auto artifacts = read_run(req.run_dir, plan, world, shapes, spec.dtype);
      // NOTE [sampler audit] The ledger and update size are checked against the plan (so a
      // duplicated or dropped example is a finding); the gradients against a reference over
      // the ids the stack really consumed (so the gradient math is judged on its own data).
      const auto reference =
          run_reference(spec, req.sampler_audit ? plan_from_consumed(spec, plan, artifacts) : plan);
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
