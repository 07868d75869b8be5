#include "conformance/run/certify.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <future>
#include <stdexcept>

#include "backends/catalog.hpp"

namespace gradcert {

namespace fs = std::filesystem;

// NOTE [certify matrix] Every strategy at its primary topology (every check, both
// optimizers, float32, every mutant), plus the wider topologies its StrategyInfo lists. With
// the default spec, D = 2 leaves the final window partial with rank 1 empty; D = 3 leaves a
// partial window too. Mutants that need data parallelism run where there is some
// (StrategyInfo::mutant_world: TP x DP, PP x DP).

std::vector<RunPlan> certify_matrix(const CertifyOptions& o) {
  std::vector<RunPlan> out;
  auto request = [&](const std::string& backend, const CertifyTopology& t, const std::string& optimizer, DType dtype,
                     const std::string& inject) {
    RunRequest r;
    r.spec = o.spec;
    r.spec.optimizer.name = optimizer;
    r.spec.dtype = dtype;
    if (!t.schedule.empty()) r.spec.pipeline.schedule = t.schedule;
    r.backend = backend;
    r.world = t.world;
    r.tp = t.tp;
    r.pp = t.pp;
    r.launcher = o.launcher;
    r.inject = inject;
    r.exe = o.exe;
    return r;
  };
  auto plan = [&](const RunRequest& r) {
    out.push_back(make_run_plan(r));  // NOTE [run plan]
    out.back().request.run_dir = o.out_dir + "/runs/" + run_dir_name(out.back());
  };
  auto add = [&](const std::string& backend, const CertifyTopology& t, const std::string& optimizer, DType dtype,
                 const std::string& inject) { plan(request(backend, t, optimizer, dtype, inject)); };
  const std::string base_opt = o.spec.optimizer.name;
  const std::string other_opt = base_opt == "sgd" ? "adamw" : "sgd";
  const auto& all = strategies();
  for (const auto* s : all) add(s->name, s->primary, base_opt, o.spec.dtype, "");
  for (const auto* s : all)
    for (const auto& t : s->wider) add(s->name, t, base_opt, o.spec.dtype, "");
  for (const auto* s : all) add(s->name, s->primary, other_opt, o.spec.dtype, "");
  if (o.spec.dtype == DType::Float64)
    for (const auto* s : all) add(s->name, s->primary, base_opt, DType::Float32, "");
  // Resumed runs (NOTE [resume]): every strategy saves and resumes at its primary topology,
  // with AdamW (moments and a step counter to lose), at the last update inside an epoch (a
  // sampler that restarts its epoch then repeats examples); none when the plan has one update.
  // The resume point comes from the run's plan without a resume (its windows; the same examples
  // either way); a checkpoint mutant is only valid once resume.at is set, so that plan is not
  // validated.
  auto resume_point = [&](const RunRequest& r) {
    const Plan unresumed = make_plan(effective_spec(r));
    int at = 0;
    for (const auto& w : unresumed.windows)
      if (w.update > 0 && w.index_in_epoch > 0) at = w.update;
    return at > 0 ? at : static_cast<int>(unresumed.windows.size()) - 1;
  };
  auto add_resumed = [&](const StrategyInfo& s, const CertifyTopology& t, const std::string& inject) {
    RunRequest r = request(s.name, t, "adamw", o.spec.dtype, inject);
    r.spec.resume.at = resume_point(r);
    if (r.spec.resume.at >= 1) plan(r);
  };
  for (const auto* s : all) add_resumed(*s, s->primary, "");
  if (o.mutants)
    for (const auto* s : all) {
      CertifyTopology m = s->primary;
      if (s->mutant_world > 0) m.world = s->mutant_world;
      for (const auto& name : mutant_names(s->name)) {
        if (needs_resume(parse_mutant(name)))
          add_resumed(*s, m, name);
        else
          add(s->name, m, base_opt, o.spec.dtype, name);
      }
    }
  return out;
}

// NOTE [checks beside the next launch] A run is its ranks, then its checks in gradcert (the
// reference at the stack's parameters, the checks, the report figures): about a third of a
// default-spec run, on one or two harness threads while the ranks' cores sit idle. So certify
// starts a planted-bug run's ranks while the run before it is still being checked on a thread,
// and prints and keeps the results in the matrix's order. Only where nothing is lost:
//  - the launch beside a check is a planted-bug run's: its figures are the checks', which do not
//    depend on timing, and it reports no throughput or memory peaks (NOTE [no probes in mutant
//    runs]). A correct run starts only once every earlier check has ended, so its step times and
//    peaks are measured alone, as before, and no reference thread runs beside a launch that
//    overlaps a check (NOTE [early reference] shares the reference cache with the checks);
//  - the check on a thread starts no process (checks_start_no_process: the C++ reference of a
//    built-in backend), since a launch ends by killing every process left below gradcert (NOTE
//    [orphans]); the Python reference runner's checks and external stacks' run alone;
//  - one check at a time, so the reference cache (NOTE [reference cache]) has one user.
// The figures are those of the one-after-the-other order: the 1381 check figures, verdicts,
// tolerances, details and sensitivity lines of the 134 runs of `gradcert certify`, and the mutant
// matrix, are identical with and without; certify took 21.4 / 21.4 s without, 19.6 / 19.9 s with
// (alternated in one session). ConformanceOverlap.ChecksBesideTheNextLaunchGiveTheSameFigures.
Report run_certify(const CertifyOptions& o, std::ostream& progress) {
  Report report;
  const auto requests = certify_matrix(o);
  int max_world = 1;
  const auto started = std::chrono::steady_clock::now();
  size_t done = 0;
  auto keep = [&](size_t i, RunReport r) {
    const RunRequest& req = requests[i].request;
    max_world = std::max(max_world, r.topology.world());
    const bool good = req.inject.empty() ? r.passed() : (r.error.empty() && !r.detected_by().empty());
    char line[256];
    std::string topo = "dp" + std::to_string(r.topology.dp);
    if (r.topology.tp > 1) topo += " tp" + std::to_string(r.topology.tp);
    if (r.topology.pp > 1) topo += " pp" + std::to_string(r.topology.pp);
    // ETA: the wall time so far per run kept, times the runs left.
    ++done;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double eta = elapsed / static_cast<double>(done) * static_cast<double>(requests.size() - done);
    std::snprintf(line, sizeof line, "# [%2zu/%zu] %-6s %-10s %-8s %-5s %-29s %s (%.1f s; ETA %.0f s)\n", i + 1,
                  requests.size(), req.backend.c_str(), topo.c_str(), r.dtype.c_str(), r.optimizer.c_str(),
                  req.inject.empty() ? "" : ("inject " + req.inject).c_str(),
                  req.inject.empty() ? (good ? "pass" : "FAIL") : (good ? "caught" : "NOT CAUGHT"), r.wall_seconds,
                  eta);
    progress << line << std::flush;
    report.runs.push_back(std::move(r));
  };
  std::future<RunReport> checking;  // the checks of run `checking_run`, on a thread
  size_t checking_run = 0;
  auto join = [&] {
    if (checking.valid()) keep(checking_run, checking.get());
  };
  for (size_t i = 0; i < requests.size() && !interrupt_signal(); ++i) {  // NOTE [interrupt]
    const RunPlan& req = requests[i];
    if (req.request.inject.empty()) join();  // a correct run's ranks run alone
    LaunchedRunPtr launched = launch_run(req, !checking.valid());
    join();
    if (checks_start_no_process(req) && i + 1 < requests.size() && !requests[i + 1].request.inject.empty()) {
      checking = std::async(std::launch::async,
                            [run = std::move(launched)]() mutable { return check_launched(std::move(run)); });
      checking_run = i;
    } else {
      keep(i, check_launched(std::move(launched)));
    }
  }
  join();
  // Scaling of every correct run against `single` of the same dtype and optimizer (same plan).
  for (auto& r : report.runs) {
    if (!r.inject.empty() || !r.has_throughput) continue;
    for (const auto& base : report.runs)
      if (base.backend == "single" && base.inject.empty() && base.has_throughput && base.dtype == r.dtype &&
          base.optimizer == r.optimizer && base.throughput.target_tokens_per_s > 0 &&
          r.throughput.target_tokens_per_s > 0) {
        compare_to_single(r.throughput, base.throughput);
        break;
      }
  }
  report.spec_json = spec_to_json(o.spec);
  report.environment = make_environment(o.spec.seed, max_world, o.launcher, device_summary(o.spec, max_world, true));
  return report;
}

// NOTE [report folders] Two invocations in the same second must not share a folder: each
// name is claimed with mkdir(2) without -p, which fails with EEXIST for all but one caller,
// and the loser takes the next name. `latest` is replaced atomically: a symlink made under
// a name of this process's own, then rename(2)d over the old link.
std::string new_report_dir(const std::string& root) {
  std::time_t now = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw std::invalid_argument(root + ": cannot create the report folder: " + ec.message());
  std::string name;
  for (int k = 0;; ++k) {
    name = k == 0 ? std::string(ts) : std::string(ts) + "-" + std::to_string(k);
    if (::mkdir((root + "/" + name).c_str(), 0777) == 0) break;
    if (errno != EEXIST || k >= 100000)
      throw std::invalid_argument(root + "/" + name + ": cannot create the report folder: " + std::strerror(errno));
  }
  const std::string tmp = root + "/.latest." + std::to_string(::getpid()) + "." + name;
  ::unlink(tmp.c_str());
  if (::symlink(name.c_str(), tmp.c_str()) == 0 && ::rename(tmp.c_str(), (root + "/latest").c_str()) != 0)
    ::unlink(tmp.c_str());  // e.g. `latest` is a real folder: leave it, as before
  return root + "/" + name;
}

std::string run_dir_name(const RunPlan& plan) {
  const RunRequest& r = plan.request;
  const Spec& s = plan.spec;
  std::string n = r.backend + "-w" + std::to_string(s.topology.world());
  if (s.topology.tp > 1) n += "-tp" + std::to_string(s.topology.tp);
  if (s.topology.pp > 1) n += "-pp" + std::to_string(s.topology.pp) + "-" + s.pipeline.schedule;
  n += "-" + dtype_name(s.dtype) + "-" + s.optimizer.name;
  if (s.resume.at > 0)
    n += "-resume" + std::to_string(s.resume.at) + (s.resume.backend.empty() ? "" : "-" + s.resume.backend) +
         (s.resume.world ? "-w" + std::to_string(s.resume.world) : "");
  if (!r.inject.empty()) n += "-" + r.inject;
  return n;
}

}  // namespace gradcert
