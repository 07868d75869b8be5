#include "conformance/run/check_artifacts.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "backends/catalog.hpp"
#include "conformance/checks/checks.hpp"
#include "conformance/checks/diagnosis.hpp"
#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/core/throughput.hpp"
#include "conformance/memory/memory.hpp"
#include "conformance/model/model.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/protocol/checkpoint.hpp"
#include "conformance/protocol/reference_artifacts.hpp"
#include "conformance/protocol/safetensors.hpp"
#include "conformance/run/python_reference.hpp"

namespace gradcert {

namespace fs = std::filesystem;

namespace {

// The examples each update really consumed (one record per DP rank, in rank and
// microstep order), as a plan the reference can run: the sampler audit's reference.
Plan plan_from_consumed(const RunPlan& planned, const std::vector<BackendUpdate>& run) {
  Plan p = planned.checked;
  const auto& targets = planned.targets_of_id;
  for (size_t u = 0; u < run.size() && u < p.windows.size(); ++u) {
    Window& w = p.windows[u];
    w.ids.clear();
    w.valid_targets = 0;
    std::map<int, const RankRecord*> replicas;
    for (const auto& r : run[u].ranks) replicas.emplace(r.dp_rank, &r);
    for (auto& [dp, rec] : replicas)
      for (const auto& mb : rec->consumed)
        for (auto id : mb) {
          if (id < 0 || id >= planned.dataset_size())
            throw ArtifactError("rank " + std::to_string(rec->rank) + " reported sample id " + std::to_string(id) +
                                " outside the dataset");
          w.ids.push_back(id);
          w.valid_targets += targets[id];
        }
  }
  return p;
}

// Useful work per second from the manifest's step times and the plan's tokens (built-in
// and external runs alike); the first update is warmup.
void add_throughput(RunReport& report, const Plan& plan, const std::vector<BackendUpdate>& run) {
  std::vector<TimedUpdate> updates;
  for (size_t u = 0; u < run.size() && u < plan.windows.size(); ++u) {
    TimedUpdate t;
    t.seconds = run[u].step_seconds;
    for (const auto& row : plan.windows[u].slots)
      for (const auto& mb : row) {
        t.input_tokens += mb.input_tokens;
        t.valid_targets += mb.valid_targets;
      }
    updates.push_back(t);
  }
  report.throughput = measure_throughput(run_label(report), plan.world(), updates, /*warmup=*/1);
  report.has_throughput = true;
}

// The memory evidence of a built-in backend run, from every rank's rank<r>.memory.json
// (NOTE [memory probes]), and the report's memory section (the estimate of the rank that
// holds the most) and throughput from the manifest's step times.
RunMemoryEvidence add_memory_and_throughput(RunReport& report, const Spec& spec, const Plan& plan,
                                            const std::string& dir, const std::vector<BackendUpdate>& run) {
  MemoryRunReport& m = report.memory;
  m.backend = run_label(report);
  m.world = plan.world();
  m.budget_bytes = spec.memory.budget_bytes;
  RunMemoryEvidence evidence;
  evidence.budget_bytes = spec.memory.budget_bytes;
  double save_pause = -1;
  for (int r = 0; r < plan.world(); ++r) {
    const RankMemory rm = read_rank_memory(dir, r);
    // A resumed run's memory is the second leg's (NOTE [resume]): its strategy's estimate.
    const std::string measured = report.resume_at > 0 ? report.resume_backend : report.backend;
    const MemoryEstimate e = estimate_for_run(spec, strategy_info(measured).sharding, r);
    evidence.ranks.push_back({r, rm.model_state_bytes, e.model_state()});
    if (!m.has_estimate || e.model_state() > m.estimate.model_state()) {
      m.has_estimate = true;
      m.estimate = e;
      m.measured_model_state_bytes = rm.model_state_bytes;
    }
    for (const auto& p : rm.peaks) {
      m.peaks.push_back(p);
      if (p.phase == "save" && p.bucket == "typical") save_pause = std::max(save_pause, p.seconds);
    }
  }
  // A resumed run's first leg measured its checkpoint save on every rank (NOTE [resume]): the
  // pause is the real one, and memory.budget holds its peaks too.
  double real_save = -1;
  if (report.resume_at > 0)
    for (int r = 0; r < report.topology.world(); ++r) {
      std::error_code ec;
      if (!fs::exists(dir + "/leg1.memory/rank" + std::to_string(r) + ".memory.json", ec))
        continue;  // a first leg that measured none
      for (const auto& p : read_rank_memory(dir + "/leg1.memory", r).peaks) {
        m.peaks.push_back(p);
        real_save = std::max(real_save, p.seconds);
      }
    }
  if (real_save >= 0) save_pause = real_save;
  evidence.peaks = m.peaks;
  report.has_memory = true;

  add_throughput(report, plan, run);
  report.throughput.save_pause_seconds = save_pause;
  for (const auto& p : m.peaks) report.throughput.peak_bytes = std::max(report.throughput.peak_bytes, p.peak_bytes);
  return evidence;
}

}  // namespace

TensorMap model_shapes(const Spec& spec, const std::string& run_dir) {
  if (spec.model.factory.empty()) return initial_shapes(spec);
  TensorMap shapes = read_safetensors(run_dir + "/initial.safetensors");
  for (auto& kv : shapes) kv.second.held = {};
  return shapes;
}

namespace {

// An external stack's save pause (NOTE [stack checkpoints]): what its ranks measured until every
// rank had saved, as checkpoint.json carries it from the stack's gradcert.json; -1 when absent.
double stack_save_seconds(const std::string& cp_dir) {
  std::error_code ec;
  const std::string path = cp_dir + "/checkpoint.json";
  if (!fs::exists(fs::symlink_status(path, ec))) return -1;
  const nlohmann::json j = parse_artifact_json(read_text_file(path), path);
  if (!j.is_object() || !j.contains("save_seconds")) return -1;
  const nlohmann::json& v = j.at("save_seconds");
  if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>()))
    throw ArtifactError(path + ": field 'save_seconds' must be a finite number >= 0, got " + json_excerpt(v));
  return v.get<double>();
}

// resume.checkpoint: the first leg's checkpoint holds the state the run had after update K - 1
// (NOTE [checkpoint format]): every tensor complete (a missing rank file or piece names the rank
// and the tensor), the parameters equal to the run's own after update K - 1 (exactly, in the run's
// dtype), the step counter K and the sampler at update K's window. What it cannot see: optimizer
// moments that are complete but wrong (the trajectory checks after the resume judge those).
CheckResult check_checkpoint(const Spec& spec, const Plan& plan, const std::string& run_dir, const std::string& nonce,
                             const TensorMap& shapes, const std::vector<BackendUpdate>& run, const std::string& saver) {
  CheckResult c;
  c.id = "resume.checkpoint";
  const int K = spec.resume.at;
  Checkpoint cp;
  try {
    cp = read_checkpoint(run_dir + "/" + kCheckpointDir, plan.world(),
                         checkpoint_expectation(shapes, spec.optimizer, spec.dtype), nonce);
  } catch (const ArtifactError& e) {
    c.verdict = Verdict::Fail;
    c.figure = 1;
    c.detail = e.what();
    return c;
  }
  std::vector<std::string> problems;
  const CheckpointRecord& r = cp.record;
  if (!saver.empty() && r.backend != saver)
    problems.push_back("checkpoint.json says backend '" + r.backend + "' saved it, not " + saver);
  if (r.updates_done != K)
    problems.push_back("it says it holds the state after " + std::to_string(r.updates_done) +
                       " updates; the first leg ran " + std::to_string(K));
  if (r.optimizer_step != K)
    problems.push_back("the optimizer's step counter is " + std::to_string(r.optimizer_step) + " after " +
                       std::to_string(K) + " updates (AdamW's bias correction would restart)");
  const Window& next = plan.windows.at(K);
  if (r.next_epoch != next.epoch || r.next_index_in_epoch != next.index_in_epoch)
    problems.push_back("the sampler is saved at epoch " + std::to_string(r.next_epoch) + " window " +
                       std::to_string(r.next_index_in_epoch) + "; update " + std::to_string(K) + " is epoch " +
                       std::to_string(next.epoch) + " window " + std::to_string(next.index_in_epoch));
  const auto type = scalar_type(spec.dtype);
  for (const auto& [name, had] : run.at(K - 1).params_after) {
    const torch::Tensor saved =
        from_host(cp.tensors.at("param." + name), scalar_type(checkpoint_dtype(spec.dtype))).to(type);
    const torch::Tensor held = from_host(had, type);
    if (torch::equal(saved, held)) continue;
    const auto differ = saved.ne(held).reshape({-1});
    const int64_t first = differ.nonzero().index({0, 0}).item<int64_t>();
    problems.push_back("param." + name + " differs from the run's parameters after update " + std::to_string(K - 1) +
                       " at " + std::to_string(differ.sum().item<int64_t>()) + " of " + std::to_string(differ.numel()) +
                       " elements (first at " + std::to_string(first) + ": saved " +
                       exact_text(saved.reshape({-1})[first].item<double>()) + ", the run had " +
                       exact_text(held.reshape({-1})[first].item<double>()) + ")");
  }
  c.figure = static_cast<double>(problems.size());
  if (problems.empty()) {
    c.verdict = Verdict::Pass;
    c.detail = "the state after update " + std::to_string(K - 1) + " (" + std::to_string(cp.tensors.size()) +
               " tensors, saved by " + r.backend + " on " + std::to_string(r.world) +
               " ranks): complete, its parameters equal the run's exactly, step counter " + std::to_string(K) +
               ", sampler at update " + std::to_string(K) + "'s window; the second leg resumed from it";
    return c;
  }
  c.verdict = Verdict::Fail;
  for (size_t i = 0; i < problems.size(); ++i) c.detail += (i ? "; " : "") + problems[i];
  return c;
}

// A run's artifacts; a resumed run's legs (NOTE [resume]) are read as one run over the windows
// both trained.
std::vector<BackendUpdate> read_legs(const RunPlan& run, const TensorMap& shapes, const std::string& nonce) {
  const RunRequest& req = run.request;
  const Spec& spec = run.spec;
  const Plan& plan = run.plan;
  if (!run.resumed()) return read_run(req.run_dir, plan, plan.world(), shapes, spec.dtype, nonce);
  const int K = spec.resume.at, N = static_cast<int>(plan.windows.size());
  std::vector<BackendUpdate> artifacts =
      read_run(req.run_dir, plan, plan.world(), shapes, spec.dtype, nonce, {"leg1.", 0, K});
  for (auto& u :
       read_run(req.run_dir, run.checked, run.final_leg().plan.world(), shapes, spec.dtype, nonce, {"leg2.", K, N - K}))
    artifacts.push_back(std::move(u));
  return artifacts;
}

// The reference a run is judged against, and the tolerances it is held to.
struct Judged {
  std::vector<ReferenceUpdate> reference, forced;  // NOTE [teacher forcing]
  double parity_tol = 0, scale_tol = 0;
};

// The Python reference runner's (a model factory, clipping, an observed job), with the diagnosis.
Judged python_reference(RunReport& report, const RunPlan& run, const std::vector<BackendUpdate>& artifacts,
                        const TensorMap& shapes, const std::string& work_dir) {
  const RunRequest& req = run.request;
  const Spec& spec = run.spec;
  const Plan& plan = run.plan;
  Judged j{{}, {}, spec.parity_tolerance(), spec.scale_tolerance()};
  const std::string ref_dir = work_dir + "/reference";
  // The spec's factory, which `check --spec` may move (the runner's default is plan.json's).
  const std::string factory = spec.model.factory.empty() ? "" : " --factory '" + spec.model.factory + "'";
  // The pieces are taken at the stack's own parameters (NOTE [pieces at the stack's
  // parameters]): the diagnosis then judges every update, diverged or not.
  run_python_tool(spec, "reference",
                  "--run-dir '" + req.run_dir + "' --out '" + ref_dir + "'" + factory +
                      (req.sampler_audit ? " --ids-from-ranks" : "") + " --pieces-at '" + req.run_dir + "'",
                  work_dir, "reference-log", run.python);
  ReferenceRun ref = read_reference_run(ref_dir, plan, shapes);
  j.reference = std::move(ref.updates);
  j.forced = std::move(ref.forced);
  // NOTE [inner precision] An observed job's model that computes in float32 (or lower) inside
  // although its parameters are float64 (Llama's RMSNorm upcasts to float32, which for a float64
  // model rounds): the job and the reference, batching the same rows otherwise, round at that
  // boundary differently, so the run is held to that dtype's calibrated tolerance (as for
  // autocast), and the note says so. The probe (the reference runner's one traced forward)
  // names the ops; float64 throughout keeps float64's tolerance.
  if (run.observed && spec.dtype == DType::Float64 && !ref.lowest_inner_dtype.empty()) {
    const bool bf = ref.lowest_inner_dtype != "float32";
    j.parity_tol = bf ? spec.tolerance.bfloat16 : spec.tolerance.float32;
    j.scale_tol = bf ? spec.tolerance.scale_bfloat16 : spec.tolerance.scale_float32;
  }
  report.diagnosis =
      diagnose(ref.pieces, j.reference, artifacts, plan.dp, plan.accum, j.parity_tol, ref.pieces_at_stack);
  if (!ref.float64_throughout)
    report.diagnosis.note +=
        "; NOTE: the model computes in lower precision inside although cast to float64 (" + ref.precision_note + ")" +
        (j.parity_tol != spec.parity_tolerance()
             ? ": held to " + ref.lowest_inner_dtype + "'s calibrated tolerances (NOTE [inner precision])"
             : std::string());
  return j;
}

// The C++ reference's: free-running from the cache (NOTE [reference cache]), the thread of NOTE
// [early reference], or computed now; a big model's is streamed through spill_dir.
Judged cpp_reference(RunReport& report, const RunPlan& run, const std::vector<BackendUpdate>& artifacts,
                     const std::string& spill_dir, EarlyReference* early) {
  const Spec& spec = run.spec;
  const Plan ref_plan = run.request.sampler_audit ? plan_from_consumed(run, artifacts) : run.checked;
  ReferenceCache& cache = reference_cache();
  const std::vector<ReferenceUpdate>* free = cache.find(spec, ref_plan);
  std::vector<ReferenceUpdate> early_free;
  if (!free && early && early->free.valid() && ReferenceCache::same(spec, early->plan, ref_plan)) {
    early_free = early->free.get();
    free = early->spill_dir.empty() ? cache.keep(spec, ref_plan, std::move(early_free)) : &early_free;
  }
  if (!free && ReferenceCache::keeps(spec, ref_plan))
    free = cache.keep(spec, ref_plan, free_running_reference(spec, ref_plan));
  References refs = run_references(spec, ref_plan, artifacts, spill_dir, free);
  report.diagnosis.note = "no diagnosis: the C++ reference computes no per-piece gradients (run with --model)";
  return Judged{std::move(refs.free_running), std::move(refs.forced), spec.parity_tolerance(), spec.scale_tolerance()};
}

// A resumed run's own findings: a trajectory that breaks exactly where the second leg began,
// and the checkpoint check (an external stack names itself in its checkpoint: NOTE [stack
// checkpoints]).
void resume_findings(RunReport& report, const RunPlan& run, const std::string& nonce, const TensorMap& shapes,
                     const std::vector<BackendUpdate>& artifacts) {
  const Spec& spec = run.spec;
  const std::string at = "first failing update " + std::to_string(spec.resume.at) + " ";
  for (auto& c : report.checks)
    if (c.verdict == Verdict::Fail && c.detail.find(at) != std::string::npos)
      c.detail += "; update " + std::to_string(spec.resume.at) +
                  " is the first the resumed leg ran, and every update before it passed: the state did not "
                  "survive the checkpoint (NOTE [resume])";
  report.checks.push_back(check_checkpoint(spec, run.plan, run.request.run_dir, nonce, shapes, artifacts,
                                           run.external() ? "" : run.request.backend));
}

}  // namespace

// NOTE [checking a run folder] What follows the launch, and all `gradcert check` does: read
// the artifacts in req.run_dir strictly (they must echo `nonce`), recompute the reference
// (the C++ one, or the Python runner for a model factory or clipping, writing its artifacts
// and log under `work_dir`), run the checks, the diagnosis and the memory / throughput
// figures into `report`. Nothing here launches a rank, so `run` and `check` agree by
// construction. Bad artifacts and a failed reference runner set report.error.
void check_artifacts(RunReport& report, const RunPlan& run, const std::string& nonce, const std::string& work_dir,
                     EarlyReference* early) {
  const RunRequest& req = run.request;
  const Spec& spec = run.spec;
  const Plan& plan = run.plan;
  if (const int sig = interrupt_signal()) {  // NOTE [interrupt]: between the launch and the checks
    report.interrupted = sig;
    report.error = "interrupted by " + signal_text(sig) + " before the artifacts were read";
    return;
  }
  // The C++ reference's tensors go to disk as they are computed (NOTE [streamed tensors]) and
  // are removed once the checks have read them: they are recomputed by `gradcert check`.
  const std::string spill_dir = work_dir + "/reference";
  struct RemoveSpill {
    std::string dir;
    bool armed = false;
    ~RemoveSpill() {
      std::error_code ec;
      if (armed) fs::remove_all(dir, ec);
    }
  } remove_spill{spill_dir};
  try {
    // Names, shapes and dtypes only: the values of the initial weights are not needed here.
    const TensorMap shapes = model_shapes(spec, req.run_dir);
    const std::vector<BackendUpdate> artifacts = read_legs(run, shapes, nonce);
    // NOTE [sampler audit] The ledger and update size are checked against the plan (so a
    // duplicated or dropped example is a finding); the gradients against a reference over
    // the ids the stack really consumed (so the gradient math is judged on its own data).
    remove_spill.armed = !needs_python_reference(spec);
    const Judged j = remove_spill.armed ? cpp_reference(report, run, artifacts, spill_dir, early)
                                        : python_reference(report, run, artifacts, shapes, work_dir);
    CheckInput input;
    input.plan = &run.checked;
    input.dataset_size = run.dataset_size();
    input.reference = &j.reference;
    if (!j.forced.empty()) input.forced = &j.forced;
    input.floor_factor = spec.tolerance.floor_factor;
    input.run = &artifacts;
    input.tolerance = j.parity_tol;
    input.scale_tolerance = j.scale_tol;
    input.targets_of_id = &run.targets_of_id;
    RunMemoryEvidence memory;
    if (run.external() || run.observed) {
      add_throughput(report, plan, artifacts);  // memory: the protocol has no memory file (v1)
      if (run.resumed()) report.throughput.save_pause_seconds = stack_save_seconds(req.run_dir + "/" + kCheckpointDir);
    } else {
      // A resumed run's memory is its second leg's, at that leg's world (NOTE [resume]).
      memory = run.resumed() ? add_memory_and_throughput(report, run.final_leg().spec, run.final_leg().plan,
                                                         req.run_dir, artifacts)
                             : add_memory_and_throughput(report, spec, plan, req.run_dir, artifacts);
      input.memory = &memory;
    }
    report.checks = run_checks(input);
    if (spec.resume.at > 0) resume_findings(report, run, nonce, shapes, artifacts);
    report.tensor_errors =
        tensor_errors(j.forced.empty() ? j.reference : j.forced, artifacts);  // per-tensor figures (HTML report)
  } catch (const ArtifactError& e) {
    report.error = std::string("bad artifacts: ") + e.what();
  } catch (const std::runtime_error& e) {  // the reference runner failed
    report.error = e.what();
  }
}
}  // namespace gradcert
