#include "conformance/run/harness.hpp"

#include "conformance/protocol/variables.hpp"

#include "conformance/run/check_artifacts.hpp"
#include "conformance/run/observe.hpp"
#include "conformance/run/run_source.hpp"
#include "conformance/run/reference_source.hpp"
#include "conformance/checks/diagnosis.hpp"
#include "conformance/protocol/checkpoint.hpp"
#include "conformance/protocol/reference_artifacts.hpp"
#include "conformance/run/python_reference.hpp"

#include "backends/catalog.hpp"
#include "conformance/checks/checks.hpp"
#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"
#include "conformance/memory/memory.hpp"
#include "conformance/protocol/digests.hpp"
#include "conformance/protocol/run_folder.hpp"
#include "conformance/protocol/safetensors.hpp"

#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "backends/runtime/comm.hpp"
#include "backends/runtime/strategy.hpp"
#include "conformance/launch/cuda_probe.hpp"
#include <nlohmann/json.hpp>

#include "conformance/protocol/artifacts.hpp"
#include "conformance/model/model.hpp"
#include "conformance/core/strict_json.hpp"

namespace gradcert {

namespace fs = std::filesystem;

std::string stack_traceback(const std::string& log) {
  std::string text;
  try {
    text = read_text_file(log);
  } catch (const ArtifactError&) {
    return "";
  }
  const auto at = text.find("Traceback (most recent call last):");
  if (at == std::string::npos) return "";
  std::string tb;
  size_t pos = at;
  for (int lines = 0; lines < 40 && pos < text.size(); ++lines) {
    const size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    tb += line + "\n";
    if (end == std::string::npos) break;
    pos = end + 1;
    // a traceback ends with its exception line (not indented, after the frames)
    if (lines > 0 && !line.empty() && line[0] != ' ' && line.find("Traceback") == std::string::npos) break;
  }
  return "\n--- the stack's first traceback (" + log + ") ---\n" + tb;
}

std::string command_failure(const std::string& message, const std::string& who, const std::string& output,
                            const std::string& run_dir) {
  std::string text = message;
  for (auto [from, to] : {std::pair<std::string, std::string>{"rank 0 ", who + " "},
                          {"--- rank 0 log tail ---", "--- " + output + " (tail) ---"},
                          {"--- rank 0 output (its log", "--- " + output + " (its log"}})
    if (auto at = text.find(from); at != std::string::npos) text.replace(at, from.size(), to);
  return text + stack_traceback(run_dir + "/rank0.log");
}

RunReport report_of(const RunPlan& run) {
  const RunRequest& req = run.request;
  const Spec& spec = run.spec;
  const Plan& plan = run.plan;
  RunReport report;
  report.backend = req.backend;
  report.topology = spec.topology;
  report.dtype = dtype_name(spec.dtype);
  report.optimizer = spec.optimizer.name;
  report.inject = req.inject;
  report.resume_at = spec.resume.at;
  if (run.resumed()) {
    report.resume_backend = spec.resume.backend.empty() ? req.backend : spec.resume.backend;
    report.resume_world = run.final_leg().plan.world();
  }
  report.updates = static_cast<int>(plan.windows.size());
  report.update_batch = plan.update_batch;
  report.run_dir = req.run_dir;
  return report;
}

namespace {

// A leg's records, kept under <leg>.* so the next leg writes its own (NOTE [resume]).
void keep_leg(const std::string& dir, int world, const std::string& leg) {
  std::vector<std::string> names = {"manifest.json", "ranks.json"};
  for (int r = 0; r < world; ++r)
    for (const char* kind : {".json", ".log"}) names.push_back("rank" + std::to_string(r) + kind);
  for (const auto& n : names) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(dir + "/" + n, ec))) fs::rename(dir + "/" + n, dir + "/" + leg + "." + n);
  }
}

// The first place two JSON values differ ("windows[3].slots"), "" when they are equal.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b, const std::string& at) {
  if (a.is_number() && b.is_number()) return a == b ? "" : at;  // 3 parsed (unsigned) == int64_t 3
  if (a.type() != b.type()) return at.empty() ? "the top level" : at;
  if (a.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it) {
      const std::string key = at.empty() ? it.key() : at + "." + it.key();
      if (!b.contains(it.key())) return key;
      if (auto d = first_difference(it.value(), b.at(it.key()), key); !d.empty()) return d;
    }
    for (auto it = b.begin(); it != b.end(); ++it)
      if (!a.contains(it.key())) return at.empty() ? it.key() : at + "." + it.key();
    return "";
  }
  if (a.is_array()) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (auto d = first_difference(a[i], b[i], at + "[" + std::to_string(i) + "]"); !d.empty()) return d;
    return a.size() == b.size() ? "" : at + " (length)";
  }
  return a == b ? "" : (at.empty() ? "the top level" : at);
}

// A run folder's input file must be what the spec makes (the stack consumed it): throws
// ArtifactError naming the file and the first difference.
void expect_input_file(const std::string& path, nlohmann::json expected, bool ignore_spec, const std::string& what) {
  nlohmann::json got = parse_artifact_json(read_text_file(path), path);
  if (ignore_spec && got.is_object() && expected.is_object()) got.erase("spec"), expected.erase("spec");
  if (const auto d = first_difference(got, expected, ""); !d.empty())
    throw ArtifactError(path + ": differs from the " + what + " the spec makes, at " + d);
}

}  // namespace

// A run whose ranks have ended, with what its checks need (launch_run, check_launched).
struct LaunchedRun {
  RunPlan run;
  RunReport report;
  std::string nonce;
  LaunchResult launched;
  std::string incomplete;  // a resumed run whose first leg saved no loadable checkpoint
  std::unique_ptr<EarlyReference> early;
  double launch_seconds = 0;
};

void LaunchedRunDeleter::operator()(LaunchedRun* run) const { delete run; }

bool checks_start_no_process(const RunPlan& run) { return !run.external() && !needs_python_reference(run.spec); }

LaunchedRunPtr launch_run(const RunRequest& req, bool early_reference) {
  return launch_run(make_run_plan(req), early_reference);
}

namespace {

// spec.json, plan.json, run.json (NOTE [run record]) and the initial weights, drawn once for
// every rank to load: the built-in ranks' and a stack's (NOTE [initial weights once]).
void write_run_inputs(const RunPlan& run, const std::string& nonce) {
  const RunRequest& req = run.request;
  const Spec& spec = run.spec;
  write_file_atomic(req.run_dir + "/spec.json", spec_to_json(spec));
  write_file_atomic(req.run_dir + "/plan.json", plan_to_json(run.plan, spec));
  write_run_record(req.run_dir, {req.backend, run.world(), spec.topology.tp, spec.topology.pp,
                                 req.launcher == LauncherKind::Mpirun ? "mpirun" : "local", req.inject,
                                 req.sampler_audit, run.external() ? req.command : "", nonce});
  write_safetensors(req.run_dir + "/initial.safetensors", initial_params(spec), {{"schema", "gradcert.initial/1"}});
}

// NOTE [resume] A resumed run (resume.at = K) is two legs in one run folder. The first leg's
// ranks train updates [0, K), save a checkpoint (NOTE [checkpoints]) and exit; the harness keeps
// their records as leg1.* and reads the checkpoint; only if it is complete does a new process
// group start (a new store; resume.backend; resume.world ranks, with the batch split
// second_leg_spec gives, so B_update and every window's examples stay): the second leg reads
// leg2.spec.json / leg2.plan.json, loads the checkpoint, trains [K, end) and measures memory; its
// records are kept as leg2.*. The checks read both legs as one run over resumed_plan's windows,
// beside resume.checkpoint on the saved state itself. An incomplete checkpoint ends the run
// after the first leg: resume.checkpoint fails naming the rank and the tensor, and nothing else
// is judged.
//
// NOTE [stack checkpoints] An external stack saves in its own format: the first leg's command
// runs with GRADCERT_SAVE_AT=K and GRADCERT_SAVE_DIR (checkpoint.stack/), the second's with
// GRADCERT_RESUME_FROM (and leg2.plan.json, its world's GRADCERT_NPROC). After the first leg
// every process has exited; gradcert.ref.dcp_export, a separate process, reads what is on disk
// with torch.distributed.checkpoint's own metadata (not the stack's load code) and writes
// gradcert's layout-independent form into checkpoint/ (each DCP chunk as a placed piece of the
// rank whose __<r>_*.distcp file holds it), so resume.checkpoint judges a DCP checkpoint exactly
// as a built-in one.

// The leg's name in a failure of a resumed run ("first leg (updates 0..K-1): ").
std::string leg_title(const RunPlan& run, const RunReport& report, size_t i) {
  if (!run.resumed()) return "";
  const int K = run.spec.resume.at;
  if (i == 0) return "first leg (updates 0.." + std::to_string(K - 1) + "): ";
  return "second leg (" + report.resume_backend + " on " + std::to_string(run.legs[i].plan.world()) +
         " ranks, updates " + std::to_string(K) + ".." + std::to_string(run.plan.windows.size() - 1) + "): ";
}

// The checkpoint the first leg saved, in gradcert's form and complete; "" when it is, else why not.
std::string saved_checkpoint(RunSource& source, const RunPlan& run, const std::string& nonce) {
  const std::string& dir = run.request.run_dir;
  try {
    source.export_checkpoint(nonce);
    (void)read_checkpoint(dir + "/" + kCheckpointDir, run.world(),
                          checkpoint_expectation(model_shapes(run.spec, dir), run.spec.optimizer, run.spec.dtype),
                          nonce);
  } catch (const std::runtime_error& e) {  // an incomplete checkpoint (ArtifactError), or one not readable
    return e.what();
  }
  return "";
}

// The second leg's inputs: its world's split of the same windows (second_leg_spec).
void write_leg_inputs(const RunPlan& run, size_t i) {
  if (i == 0) return;
  const RunLegPlan& leg = run.legs[i];
  write_file_atomic(run.request.run_dir + "/leg2.spec.json", spec_to_json(leg.spec));
  write_file_atomic(run.request.run_dir + "/leg2.plan.json", plan_to_json(leg.plan, leg.spec));
}

}  // namespace

LaunchedRunPtr launch_run(const RunPlan& run, bool early_reference) {
  const auto t0 = std::chrono::steady_clock::now();
  const RunRequest& req = run.request;
  RunReport report = report_of(run);
  const std::string nonce = prepare_run_folder(req.run_dir);  // NOTE [run nonce]
  write_run_inputs(run, nonce);
  std::unique_ptr<RunSource> source = source_of(run);  // NOTE [run sources]
  source->write_inputs(nonce);
  auto early = std::make_unique<EarlyReference>();  // NOTE [early reference]
  if (early_reference) start_early_reference(*early, run, run.widest_leg());
  LaunchResult launched;
  std::string incomplete;  // a resumed run whose first leg saved no loadable checkpoint
  for (size_t i = 0; i < run.legs.size(); ++i) {
    write_leg_inputs(run, i);
    launched = launch(source->leg(i, nonce));
    if (!launched.ok) {
      launched.message = leg_title(run, report, i) + launched.message;
      break;
    }
    if (run.resumed()) keep_leg(req.run_dir, run.legs[i].plan.world(), "leg" + std::to_string(i + 1));
    if (i + 1 < run.legs.size() && !(incomplete = saved_checkpoint(*source, run, nonce)).empty()) break;
  }
  if (!launched.ok) launched.message = source->failure(launched.message);
  source.reset();  // the store of the built-in ranks' last leg
  try {
    write_digests(req.run_dir, nonce);  // NOTE [artifact digests]
  } catch (const std::exception& e) {
    if (launched.ok) launched.message = std::string("the run ended, but its artifacts' digests: ") + e.what();
    launched.ok = false;
  }
  LaunchedRunPtr out(
      new LaunchedRun{run, std::move(report), nonce, std::move(launched), std::move(incomplete), std::move(early), 0});
  out->launch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

RunReport check_launched(LaunchedRunPtr run) {
  const auto t0 = std::chrono::steady_clock::now();
  const RunRequest& req = run->run.request;
  const LaunchResult& launched = run->launched;
  RunReport& report = run->report;
  report.interrupted = launched.interrupted;
  if (!launched.ok) {
    report.error = name_full_disk(launched.message);  // NOTE [run sources], NOTE [disk full]
  } else if (!run->incomplete.empty()) {
    CheckResult c;
    c.id = "resume.checkpoint";
    c.verdict = Verdict::Fail;
    c.figure = 1;
    c.detail = run->incomplete + " (the second leg was not started: nothing else is judged)";
    report.checks.push_back(c);
  } else {
    check_artifacts(report, run->run, run->nonce, req.run_dir, run->early.get());
  }
  if (!report.interrupted) report.interrupted = interrupt_signal();
  run->early.reset();  // its thread is joined and its spill removed before the run counts as checked
  report.wall_seconds =
      run->launch_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::move(report);
}

RunReport run_backend(const RunRequest& req) { return check_launched(launch_run(req)); }

RunReport run_backend(const RunPlan& run) { return check_launched(launch_run(run)); }

CheckedRun check_run(const CheckRequest& c) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string& dir = c.run_dir;
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(dir, ec)))
    throw std::invalid_argument(dir + ": not a run folder (no such folder, or not a folder)");
  if (fs::exists(fs::symlink_status(dir + "/observed.json", ec))) return check_observed(c);  // NOTE [observe record]
  const RunRecord rec = read_run_record(dir);
  if (const std::string marker = dir + "/" + kRunFolderMarker; fs::exists(fs::symlink_status(marker, ec)))
    if (run_folder_nonce(dir) != rec.nonce)
      throw ArtifactError(dir + "/" + kRunRecordFile + ": field 'nonce' is not the run folder's (" + marker +
                          "): a run.json from another run?");
  verify_digests(dir, rec.nonce);  // NOTE [artifact digests]
  RunRequest req;
  const std::string spec_path = c.spec_path.empty() ? dir + "/spec.json" : c.spec_path;
  try {
    req.spec = load_spec(spec_path);
  } catch (const SpecError& e) {
    throw std::invalid_argument(spec_path + ": " + e.what());
  }
  req.backend = rec.backend;
  req.world = rec.world;
  req.tp = rec.tp;
  req.pp = rec.pp;
  req.launcher = rec.launcher == "mpirun" ? LauncherKind::Mpirun : LauncherKind::Local;
  req.inject = rec.inject;
  req.sampler_audit = rec.sampler_audit;
  req.command = rec.command;
  req.run_dir = dir;
  const RunPlan run = make_run_plan(req);
  const Spec& spec = run.spec;
  // The inputs the ranks consumed are the spec's (with --spec, only the plan's windows count).
  expect_input_file(dir + "/plan.json", nlohmann::json::parse(plan_to_json(run.plan, spec)), !c.spec_path.empty(),
                    "plan");
  if (run.external())
    expect_input_file(dir + "/dataset.json", nlohmann::json::parse(dataset_json(external_samples(spec))), false,
                      "dataset");
  if (run.resumed()) {  // the second leg's inputs (NOTE [resume])
    const RunLegPlan& second = run.final_leg();
    expect_input_file(dir + "/leg2.plan.json", nlohmann::json::parse(plan_to_json(second.plan, second.spec)),
                      !c.spec_path.empty(), "second leg's plan");
  }

  RunReport report = report_of(run);
  report.checked_from = dir;
  if (needs_python_reference(spec)) {  // the runner's artifacts and log: never into the run folder
    fs::create_directories(c.work_dir, ec);
    if (ec) throw std::invalid_argument(c.work_dir + ": cannot create: " + ec.message());
  }
  check_artifacts(report, run, rec.nonce, c.work_dir);
  if (!report.interrupted) report.interrupted = interrupt_signal();
  report.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {spec, req.launcher, std::move(report)};
}

std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("gradcert") : p.string();
}

std::string device_summary(const Spec& spec, int world, bool builtin) {
  if (spec.device != "cuda") return "cpu";
  const int gpus = probe_cuda().count;
  std::string s = "cuda (" + std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s");
  if (builtin) {
    const std::string pg = process_group_kind(true, world, gpus);
    s += "; " + std::to_string(world) + " ranks on cuda:<rank mod " + std::to_string(gpus) + ">, process group " + pg +
         (pg == "gloo" ? " staging CUDA tensors through host memory (ranks share a GPU, which NCCL refuses)" : "");
  }
  return s + "; TF32 " + (spec.tf32 ? "on" : "off") + "; float64 reference on the CPU)";
}

Environment make_environment(uint64_t seed, int world, LauncherKind launcher, const std::string& device) {
  Environment e;
  e.torch = TORCH_VERSION;
  e.device = device;
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
