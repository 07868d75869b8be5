#include "conformance/run/harness.hpp"

#include "conformance/checks/diagnosis.hpp"
#include "conformance/launch/store.hpp"
#include "conformance/protocol/checkpoint.hpp"
#include "conformance/protocol/reference_artifacts.hpp"
#include "conformance/run/python_reference.hpp"

#include "backends/catalog.hpp"
#include "conformance/checks/checks.hpp"
#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"
#include "conformance/memory/memory.hpp"
#include "conformance/protocol/run_folder.hpp"
#include "conformance/protocol/safetensors.hpp"

#include <torch/version.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "backends/runtime/strategy.hpp"
#include <nlohmann/json.hpp>

#include "conformance/protocol/artifacts.hpp"
#include "conformance/core/dataset.hpp"
#include "conformance/model/model.hpp"
#include "conformance/model/reference.hpp"
#include "conformance/core/throughput.hpp"
#include "conformance/core/strict_json.hpp"

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

// A crashed stack's Python traceback (torchrun's own summary says only that a child failed):
// the first traceback in the command's output, up to 40 lines, with the log's path.
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

// dataset.json: the spec's examples for an external stack (backends/PROTOCOL.md).
nlohmann::json external_dataset(const Spec& spec) {
  nlohmann::json samples = nlohmann::json::array();
  for (int64_t id = 0; id < spec.dataset.size; ++id) {
    const Sample s = make_sample(spec, id);
    samples.push_back({{"id", id}, {"tokens", s.tokens}, {"labels", s.labels}});
  }
  return {{"schema", "gradcert.dataset/1"}, {"ignore_index", kIgnoreIndex}, {"pad_token", kPadToken},
          {"samples", samples}};
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
      if (!fs::exists(dir + "/leg1.memory/rank" + std::to_string(r) + ".memory.json", ec)) continue;  // a first leg that measured none
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

// The model's names, shapes and dtypes, no values: the spec's tiny LM, or a model factory's
// initial.safetensors in the run folder.
TensorMap model_shapes(const Spec& spec, const std::string& run_dir) {
  if (spec.model.factory.empty()) return initial_shapes(spec);
  TensorMap shapes = read_safetensors(run_dir + "/initial.safetensors");
  for (auto& kv : shapes) kv.second.held = {};
  return shapes;
}

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

// The memory this machine can still give (MemAvailable of /proc/meminfo; else physical memory).
double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024.0;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

// The tiny LM's parameter count, in double (a d_model of 2^31 would overflow int64).
double tiny_lm_parameters(const ModelSpec& m) {
  const double d = m.d_model, f = m.d_ff, v = m.vocab, L = m.layers, T = m.max_len;
  return 2 * v * d + T * d + L * (4 * d * d + 2 * d * f + f + 6 * d) + 2 * d;
}

// NOTE [oversized specs] A spec whose model cannot fit is refused before any rank starts, naming
// the field that made it so (the one furthest above its default): the float64 reference alone
// holds the model's weights and gradients (16 bytes a parameter), whatever the strategy, so that
// is a lower bound of what the run needs on this machine. Counted in double: a d_model of 2^31
// would overflow int64. What it does not bound: the ranks' own state and activations (a spec
// that passes this can still need more than the machine has).
void refuse_oversized(const Spec& spec) {
  if (!spec.model.factory.empty()) return;  // the user's model: its size is known once built
  const ModelSpec& m = spec.model;
  const double d = m.d_model, f = m.d_ff, v = m.vocab, L = m.layers, T = m.max_len;
  const double params = tiny_lm_parameters(m);
  const double need = 16 * params, have = available_memory_bytes();
  if (have <= 0 || need <= have) return;
  const ModelSpec defaults;
  std::pair<double, std::string> worst{0, "model.d_model"};
  for (auto [value, normal, field] : {std::tuple{d, double(defaults.d_model), "model.d_model"},
                                      {v, double(defaults.vocab), "model.vocab"},
                                      {L, double(defaults.layers), "model.layers"},
                                      {f, double(defaults.d_ff), "model.d_ff"},
                                      {T, double(defaults.max_len), "model.max_len"}})
    worst = std::max(worst, std::pair<double, std::string>{value / normal, field});
  throw SpecError(worst.second, "the model has " + sci(params) +
                                    " parameters; the float64 reference alone needs at least " +
                                    human_bytes(need) + " (weights + gradients) and this machine has " +
                                    human_bytes(have) + " available: refused before any rank starts");
}

// resume.at must leave the second leg updates to run.
void validate_resume_at(const Spec& spec, const Plan& plan) {
  const int updates = static_cast<int>(plan.windows.size());
  if (spec.resume.at >= updates)
    throw std::invalid_argument("resume.at (--resume-at) is " + std::to_string(spec.resume.at) + ": the plan has " +
                                std::to_string(updates) + " updates, so it must be in 1.." + std::to_string(updates - 1) +
                                " (a second leg must have updates to run)");
}

// Bad input the run (or the check of its folder) refuses before anything runs: throws
// std::invalid_argument naming the option.
void validate_request(const RunRequest& req, const Spec& spec, const Plan& plan) {
  refuse_oversized(spec);
  if (spec.resume.at > 0) {
    validate_resume_at(spec, plan);
    (void)resumed_plan(spec);  // SpecError naming resume.* when no batch split keeps B_update
  }
  if (req.backend == kExternalBackend) {
    if (req.command.empty()) throw std::invalid_argument("--backend external needs --command \"<launch command>\"");
    if (!req.inject.empty()) throw std::invalid_argument("--inject applies to built-in backends only");
    if (!spec.resume.backend.empty())
      throw std::invalid_argument("resume.backend (--resume-backend) names a built-in strategy; an external stack's "
                                  "second leg is resume.command (--resume-command)");
    if (spec.resume.at > 0 && req.sampler_audit)
      throw std::invalid_argument("--sampler-audit with resume.at (--resume-at): a stack's own sampler position is "
                                  "not part of the checkpoint protocol yet");
    return;
  }
  if (!spec.resume.command.empty())
    throw std::invalid_argument("resume.command (--resume-command) applies to --backend external; a built-in "
                                "second leg is resume.backend (--resume-backend)");
  if (req.sampler_audit) throw std::invalid_argument("--sampler-audit applies to --backend external only");
  if (!spec.model.factory.empty())
    throw std::invalid_argument("model.factory (--model) applies to --backend external: the built-in backends train "
                                "gradcert's tiny LM");
  if (spec.optimizer.max_grad_norm > 0)
    throw std::invalid_argument("optimizer.max_grad_norm applies to --backend external: the built-in backends do "
                                "not clip");
  auto backend = make_backend(req.backend);
  const Mutant mutant = parse_mutant(req.inject);
  backend->validate(plan, plan.world(), mutant);
  backend->validate_model(spec.model, plan);
  if (needs_resume(mutant) && spec.resume.at == 0)
    throw std::invalid_argument("--inject " + req.inject + " plants its bug in a checkpoint: it needs --resume-at K");
  if (spec.resume.at == 0) return;
  const std::string second = spec.resume.backend.empty() ? req.backend : spec.resume.backend;
  const Plan leg2 = make_plan(second_leg_spec(spec));
  auto resumed = make_backend(second);
  resumed->validate(leg2, leg2.world(), mutant);
  resumed->validate_model(spec.model, leg2);
}

RunReport report_of(const RunRequest& req, const Spec& spec, const Plan& plan) {
  RunReport report;
  report.backend = req.backend;
  report.topology = spec.topology;
  report.dtype = dtype_name(spec.dtype);
  report.optimizer = spec.optimizer.name;
  report.inject = req.inject;
  report.resume_at = spec.resume.at;
  if (spec.resume.at > 0) {
    report.resume_backend = spec.resume.backend.empty() ? req.backend : spec.resume.backend;
    report.resume_world = second_leg_spec(spec).topology.world();
  }
  report.updates = static_cast<int>(plan.windows.size());
  report.update_batch = plan.update_batch;
  report.run_dir = req.run_dir;
  return report;
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
    const torch::Tensor saved = from_host(cp.tensors.at("param." + name), scalar_type(checkpoint_dtype(spec.dtype))).to(type);
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

// A leg's records, kept under <leg>.* so the next leg writes its own (NOTE [resume]).
void keep_leg(const std::string& dir, int world, const std::string& leg) {
  std::vector<std::string> names = {"manifest.json"};
  for (int r = 0; r < world; ++r)
    for (const char* kind : {".json", ".log"}) names.push_back("rank" + std::to_string(r) + kind);
  for (const auto& n : names) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(dir + "/" + n, ec))) fs::rename(dir + "/" + n, dir + "/" + leg + "." + n);
  }
}

// NOTE [reference cache] The free-running reference and its floor are a function of the spec and
// the plan alone, so one gradcert process computes them once per (spec, plan): certify's runs of
// one spec and data-parallel degree (the mutants beside their correct run, most strategies)
// share them, and each run still gets its own teacher-forced reference, from its own artifacts
// (the checks that judge a run's gradients and steps read that one). Only small models are kept,
// held in memory (kCachedModelBytes a run, kCacheBytes in all); a bigger one is recomputed per run
// and streamed through the run's folder (NOTE [streamed tensors]). Runs are checked one at a time.
class ReferenceCache {
 public:
  static constexpr double kCachedModelBytes = 32.0 * (1 << 20), kCacheBytes = 256.0 * (1 << 20);

  /// float64 gradients and parameters of every update (the C++ reference is the tiny LM's).
  static double bytes(const Spec& spec, const Plan& plan) {
    return 16 * tiny_lm_parameters(spec.model) * static_cast<double>(plan.windows.size());
  }
  static bool keeps(const Spec& spec, const Plan& plan) { return bytes(spec, plan) <= kCachedModelBytes; }
  /// Whether two plans train the same windows (one free-running reference serves both).
  static bool same(const Spec& spec, const Plan& a, const Plan& b) { return key(spec, a) == key(spec, b); }

  const std::vector<ReferenceUpdate>* find(const Spec& spec, const Plan& plan) const {
    const auto it = entries_.find(key(spec, plan));
    return it == entries_.end() ? nullptr : &it->second;
  }
  const std::vector<ReferenceUpdate>* keep(const Spec& spec, const Plan& plan, std::vector<ReferenceUpdate> free) {
    if (held_ + bytes(spec, plan) > kCacheBytes) entries_.clear(), held_ = 0;
    held_ += bytes(spec, plan);
    return &(entries_[key(spec, plan)] = std::move(free));
  }

 private:
  // The spec and every window's microbatches (a resumed run's plan mixes two worlds' splits).
  static std::string key(const Spec& spec, const Plan& plan) {
    std::string key = spec_to_json(spec);
    for (const Window& w : plan.windows) {
      key += "\nu" + std::to_string(w.update) + ":";
      for (int64_t id : w.ids) key += std::to_string(id) + ",";
      for (const auto& row : w.slots) {
        key += " |";
        for (const Microbatch& mb : row) {
          key += " [";
          for (int64_t id : mb.ids) key += std::to_string(id) + ",";
        }
      }
    }
    return key;
  }
  std::map<std::string, std::vector<ReferenceUpdate>> entries_;
  double held_ = 0;
};

ReferenceCache& reference_cache() {
  static ReferenceCache cache;
  return cache;
}

// The plan the C++ reference runs: the run's, or for a resumed run the windows both legs trained.
Plan reference_plan(const Spec& spec, const Plan& plan) { return spec.resume.at > 0 ? resumed_plan(spec) : plan; }

// NOTE [early reference] The free-running half of the C++ reference needs nothing from the ranks
// (NOTE [reference cache]), so where the machine has a core beyond the built-in ranks' (one
// intra-op thread each), it runs on a thread of the harness while they train: into the run
// folder's reference/ (streamed, NOTE [streamed tensors]), or held and then cached when the model
// is small. The teacher-forced half waits for the ranks' artifacts. Where the ranks have every
// core (here: 2 cores, 2 ranks), it runs after them as before, so that it does not slow the steps
// the throughput table reports; an external stack's ranks may use every core, so they never
// share. A run that fails stops it at its next update; its files are removed with the run's
// reference/ folder.
struct EarlyReference {
  std::atomic<bool> stop{false};
  std::future<std::vector<ReferenceUpdate>> free;
  std::string spill_dir;  ///< "" when the result is held (a small model)
  Plan plan;
  EarlyReference() = default;
  EarlyReference(const EarlyReference&) = delete;
  EarlyReference& operator=(const EarlyReference&) = delete;
  ~EarlyReference() {
    stop = true;
    if (free.valid()) free.wait();
    std::error_code ec;
    if (!spill_dir.empty()) fs::remove_all(spill_dir, ec);
  }
};

void start_early_reference(EarlyReference& early, const RunRequest& req, const Spec& spec, const Plan& plan,
                           int ranks) {
  if (req.backend == kExternalBackend || needs_python_reference(spec) ||
      std::thread::hardware_concurrency() <= static_cast<unsigned>(ranks))
    return;
  early.plan = reference_plan(spec, plan);
  if (reference_cache().find(spec, early.plan)) return;
  if (!ReferenceCache::keeps(spec, early.plan)) early.spill_dir = req.run_dir + "/reference";
  early.free = std::async(std::launch::async, [&early, spec] {
    auto free = free_running_reference(spec, early.plan, early.spill_dir, &early.stop, RouteThreads::One);
    ::malloc_trim(0);  // what this thread's malloc arena freed goes back, not beside the main thread's
    return free;
  });
}

// NOTE [checking a run folder] What follows the launch, and all `gradcert check` does: read
// the artifacts in req.run_dir strictly (they must echo `nonce`), recompute the reference
// (the C++ one, or the Python runner for a model factory or clipping, writing its artifacts
// and log under `work_dir`), run the checks, the diagnosis and the memory / throughput
// figures into `report`. Nothing here launches a rank, so `run` and `check` agree by
// construction. Bad artifacts and a failed reference runner set report.error.
void check_artifacts(RunReport& report, const RunRequest& req, const Spec& spec, const Plan& plan,
                     const std::string& nonce, const std::string& work_dir, EarlyReference* early = nullptr) {
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
    // A resumed run's legs (NOTE [resume]) are read as one run over the windows both trained.
    const bool resumed = spec.resume.at > 0;
    const Spec leg2_spec = second_leg_spec(spec);
    const Plan leg2_plan = resumed ? make_plan(leg2_spec) : Plan{};
    const Plan plan_in = reference_plan(spec, plan);
    std::vector<BackendUpdate> artifacts;
    if (!resumed) {
      artifacts = read_run(req.run_dir, plan, plan.world(), shapes, spec.dtype, nonce);
    } else {
      const int K = spec.resume.at, N = static_cast<int>(plan.windows.size());
      artifacts = read_run(req.run_dir, plan, plan.world(), shapes, spec.dtype, nonce, {"leg1.", 0, K});
      for (auto& u : read_run(req.run_dir, plan_in, leg2_plan.world(), shapes, spec.dtype, nonce, {"leg2.", K, N - K}))
        artifacts.push_back(std::move(u));
    }
    // NOTE [sampler audit] The ledger and update size are checked against the plan (so a
    // duplicated or dropped example is a finding); the gradients against a reference over
    // the ids the stack really consumed (so the gradient math is judged on its own data).
    std::vector<ReferenceUpdate> reference, forced;  // NOTE [teacher forcing]
    if (needs_python_reference(spec)) {
      const std::string ref_dir = work_dir + "/reference";
      // The spec's factory, which `check --spec` may move (the runner's default is plan.json's).
      const std::string factory = spec.model.factory.empty() ? "" : " --factory '" + spec.model.factory + "'";
      // The pieces are taken at the stack's own parameters (NOTE [pieces at the stack's
      // parameters]): the diagnosis then judges every update, diverged or not.
      run_python_tool(spec, "reference", "--run-dir '" + req.run_dir + "' --out '" + ref_dir + "'" + factory +
                                             (req.sampler_audit ? " --ids-from-ranks" : "") + " --pieces-at '" +
                                             req.run_dir + "'",
                      work_dir, "reference-log");
      ReferenceRun ref = read_reference_run(ref_dir, plan, shapes);
      reference = std::move(ref.updates);
      forced = std::move(ref.forced);
      report.diagnosis = diagnose(ref.pieces, reference, artifacts, plan.dp, plan.accum, spec.parity_tolerance(),
                                  ref.pieces_at_stack);
      if (!ref.float64_throughout)
        report.diagnosis.note += "; NOTE: the model computes in lower precision inside although cast to float64 (" +
                                 ref.precision_note + ")";
    } else {
      remove_spill.armed = true;
      const Plan ref_plan = req.sampler_audit ? plan_from_consumed(spec, plan, artifacts) : plan_in;
      // Free-running: from the cache (NOTE [reference cache]), the thread of NOTE [early reference],
      // or computed now; a big model's is streamed through spill_dir.
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
      reference = std::move(refs.free_running);
      forced = std::move(refs.forced);
      report.diagnosis.note = "no diagnosis: the C++ reference computes no per-piece gradients (run with --model)";
    }
    CheckInput input;
    input.plan = &plan_in;
    input.dataset_size = spec.dataset.size;
    input.reference = &reference;
    if (!forced.empty()) input.forced = &forced;
    input.floor_factor = spec.tolerance.floor_factor;
    input.run = &artifacts;
    input.tolerance = spec.parity_tolerance();
    input.scale_tolerance = spec.scale_tolerance();
    std::vector<int64_t> targets_of_id(spec.dataset.size);
    for (int64_t id = 0; id < spec.dataset.size; ++id) targets_of_id[id] = make_sample(spec, id).valid_targets();
    input.targets_of_id = &targets_of_id;
    RunMemoryEvidence memory;
    if (req.backend == kExternalBackend) {
      add_throughput(report, plan, artifacts);  // memory: the protocol has no memory file (v1)
      if (resumed) report.throughput.save_pause_seconds = stack_save_seconds(req.run_dir + "/" + kCheckpointDir);
    } else {
      // A resumed run's memory is its second leg's, at that leg's world (NOTE [resume]).
      memory = resumed ? add_memory_and_throughput(report, leg2_spec, leg2_plan, req.run_dir, artifacts)
                       : add_memory_and_throughput(report, spec, plan, req.run_dir, artifacts);
      input.memory = &memory;
    }
    report.checks = run_checks(input);
    if (spec.resume.at > 0) {
      // The diagnosis of a resume: a trajectory that breaks exactly where the second leg began.
      const std::string at = "first failing update " + std::to_string(spec.resume.at) + " ";
      for (auto& c : report.checks)
        if (c.verdict == Verdict::Fail && c.detail.find(at) != std::string::npos)
          c.detail += "; update " + std::to_string(spec.resume.at) +
                      " is the first the resumed leg ran, and every update before it passed: the state did not "
                      "survive the checkpoint (NOTE [resume])";
      // An external stack names itself in its checkpoint (NOTE [stack checkpoints]).
      report.checks.push_back(check_checkpoint(spec, plan, req.run_dir, nonce, shapes, artifacts,
                                               req.backend == kExternalBackend ? "" : req.backend));
    }
    report.tensor_errors = tensor_errors(forced.empty() ? reference : forced, artifacts);  // per-tensor figures (HTML report)
  } catch (const ArtifactError& e) {
    report.error = std::string("bad artifacts: ") + e.what();
  } catch (const std::runtime_error& e) {  // the reference runner failed
    report.error = e.what();
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
  RunRequest req;
  Spec spec;
  Plan plan;
  RunReport report;
  std::string nonce;
  LaunchResult launched;
  std::string incomplete;  // a resumed run whose first leg saved no loadable checkpoint
  std::unique_ptr<EarlyReference> early;
  double launch_seconds = 0;
};

void LaunchedRunDeleter::operator()(LaunchedRun* run) const { delete run; }

bool checks_start_no_process(const RunRequest& req) {
  return req.backend != kExternalBackend && !needs_python_reference(effective_spec(req));
}

LaunchedRunPtr launch_run(const RunRequest& req, bool early_reference) {
  const auto t0 = std::chrono::steady_clock::now();
  const Spec spec = effective_spec(req);
  const Plan plan = make_plan(spec);
  const int world = plan.world();
  const bool external = req.backend == kExternalBackend;
  validate_request(req, spec, plan);

  RunReport report = report_of(req, spec, plan);
  const std::string nonce = prepare_run_folder(req.run_dir);  // NOTE [run nonce]
  write_file_atomic(req.run_dir + "/spec.json", spec_to_json(spec));
  write_file_atomic(req.run_dir + "/plan.json", plan_to_json(plan, spec));
  write_run_record(req.run_dir, {req.backend, world, spec.topology.tp, spec.topology.pp,
                                 req.launcher == LauncherKind::Mpirun ? "mpirun" : "local", req.inject,
                                 req.sampler_audit, external ? req.command : "", nonce});  // NOTE [run record]

  // NOTE [store] The harness serves the ranks' rendezvous store itself (NOTE [rank store]), on
  // an abstract Unix socket of its own for the life of the run: no rank has to win a race for a
  // free port another run may take first, no name is looked up, and no rank's death takes the
  // store with it.
  auto serve_store = [&](int ranks) {
    std::unique_ptr<StoreServer> served;
    if (!external && ranks > 1) served = std::make_unique<StoreServer>();
    return served;
  };
  std::unique_ptr<StoreServer> store = serve_store(world);
  auto worker_argv = [&](const std::string& backend, const std::unique_ptr<StoreServer>& served) {
    std::vector<std::string> argv = {req.exe, "worker", "--run-dir", req.run_dir, "--backend", backend};
    if (served) argv.insert(argv.end(), {"--store", served->address()});
    if (!req.inject.empty()) argv.insert(argv.end(), {"--inject", req.inject});
    return argv;
  };
  LaunchRequest launch_req;
  launch_req.kind = req.launcher;
  launch_req.world = world;
  launch_req.argv = worker_argv(req.backend, store);
  launch_req.env = {{"GRADCERT_RUN_NONCE", nonce}};
  // The initial weights, drawn once for every rank to load: an external stack's, and the
  // built-in ranks' (NOTE [initial weights once]).
  write_safetensors(req.run_dir + "/initial.safetensors", initial_params(spec), {{"schema", "gradcert.initial/1"}});
  if (external) {
    // One launcher process runs the command; the stack starts its own ranks (e.g. torchrun).
    write_file_atomic(req.run_dir + "/dataset.json", external_dataset(spec).dump());
    // NOTE [model factory] The user's model: the reference runner calls the factory once
    // (seeded) and writes initial.safetensors with the model's own names and shapes; the
    // stack and the reference both start from it.
    if (!spec.model.factory.empty())
      run_python_tool(spec, "initial", "--plan '" + req.run_dir + "/plan.json' --out '" + req.run_dir +
                                           "/initial.safetensors'", req.run_dir, "initial");
    launch_req.kind = LauncherKind::Local;
    launch_req.rank_env = false;  // the stack's ranks are its own: no GRADCERT_RANK / GRADCERT_WORLD
    launch_req.world = 1;
    launch_req.argv = {"/bin/sh", "-c", req.command};
    launch_req.env = {{"GRADCERT_RUN_DIR", req.run_dir},
                      {"GRADCERT_PLAN", req.run_dir + "/plan.json"},
                      {"GRADCERT_DATASET", req.run_dir + "/dataset.json"},
                      {"GRADCERT_INIT", req.run_dir + "/initial.safetensors"},
                      {"GRADCERT_OUT", req.run_dir},
                      {"GRADCERT_NPROC", std::to_string(world)},
                      {"GRADCERT_MASTER_PORT", std::to_string(free_local_port())},
                      {"GRADCERT_SAMPLER", req.sampler_audit ? "own" : "plan"},
                      {"GRADCERT_RUN_NONCE", nonce}};
  }
  launch_req.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec.timeout.run_s * 1000));
  launch_req.log_dir = req.run_dir;
  auto early = std::make_unique<EarlyReference>();  // NOTE [early reference]
  if (early_reference)
    start_early_reference(*early, req, spec, plan,
                          spec.resume.at > 0 ? std::max(world, second_leg_spec(spec).topology.world()) : world);
  LaunchResult launched;
  std::string incomplete;  // a resumed run whose first leg saved no loadable checkpoint
  if (spec.resume.at > 0) {
    // NOTE [resume] A resumed run (resume.at = K) is two legs in one run folder. The first
    // leg's ranks train updates [0, K), save a checkpoint (NOTE [checkpoints]) and exit; the
    // harness keeps their records as leg1.* and reads the checkpoint; only if it is complete
    // does a new process group start (a new store; resume.backend; resume.world ranks, with the
    // batch split second_leg_spec gives, so B_update and every window's examples stay): the
    // second leg reads leg2.spec.json / leg2.plan.json, loads the checkpoint, trains [K, end)
    // and measures memory; its records are kept as leg2.*. The checks read both legs as one run
    // over resumed_plan's windows, beside resume.checkpoint on the saved state itself. An
    // incomplete checkpoint ends the run after the first leg: resume.checkpoint fails naming
    // the rank and the tensor, and nothing else is judged.
    //
    // NOTE [stack checkpoints] An external stack saves in its own format: the first leg's
    // command runs with GRADCERT_SAVE_AT=K and GRADCERT_SAVE_DIR (checkpoint.stack/), the
    // second's with GRADCERT_RESUME_FROM (and leg2.plan.json, its world's GRADCERT_NPROC). After
    // the first leg every process has exited; gradcert_ref.dcp_export, a separate process,
    // reads what is on disk with torch.distributed.checkpoint's own metadata (not the stack's
    // load code) and writes gradcert's layout-independent form into checkpoint/ (each DCP
    // chunk as a placed piece of the rank whose __<r>_*.distcp file holds it), so
    // resume.checkpoint judges a DCP checkpoint exactly as a built-in one.
    const std::string cp_dir = req.run_dir + "/" + kCheckpointDir;
    const std::string stack_dir = req.run_dir + "/checkpoint.stack";
    LaunchRequest first = launch_req;
    if (external) {
      first.env["GRADCERT_SAVE_AT"] = std::to_string(spec.resume.at);
      first.env["GRADCERT_SAVE_DIR"] = stack_dir;
    } else {
      first.argv.insert(first.argv.end(), {"--save-at", std::to_string(spec.resume.at)});
    }
    launched = launch(first);
    if (!launched.ok) launched.message = "first leg (updates 0.." + std::to_string(spec.resume.at - 1) + "): " + launched.message;
    if (launched.ok) {
      keep_leg(req.run_dir, world, "leg1");
      try {
        if (external)
          run_python_tool(spec, "dcp_export", "--from '" + stack_dir + "' --out '" + cp_dir + "' --world " +
                                                  std::to_string(world) + " --nonce " + nonce,
                          req.run_dir, "checkpoint-export");
        (void)read_checkpoint(cp_dir, world,
                              checkpoint_expectation(model_shapes(spec, req.run_dir), spec.optimizer, spec.dtype),
                              nonce);
      } catch (const std::runtime_error& e) {  // an incomplete checkpoint (ArtifactError), or one not readable
        incomplete = e.what();
      }
    }
    if (launched.ok && incomplete.empty()) {
      // The second leg's inputs: its world's split of the same windows (second_leg_spec).
      const Spec second_spec = second_leg_spec(spec);
      const Plan second_plan = make_plan(second_spec);
      write_file_atomic(req.run_dir + "/leg2.spec.json", spec_to_json(second_spec));
      write_file_atomic(req.run_dir + "/leg2.plan.json", plan_to_json(second_plan, second_spec));
      store = serve_store(second_plan.world());  // a fresh rendezvous: the first group's keys stay behind
      LaunchRequest second = launch_req;
      if (external) {  // NOTE [stack checkpoints]
        second.argv = {"/bin/sh", "-c", spec.resume.command.empty() ? req.command : spec.resume.command};
        second.env["GRADCERT_PLAN"] = req.run_dir + "/leg2.plan.json";
        second.env["GRADCERT_NPROC"] = std::to_string(second_plan.world());
        second.env["GRADCERT_MASTER_PORT"] = std::to_string(free_local_port());
        second.env["GRADCERT_RESUME_FROM"] = stack_dir;
      } else {
        second.world = second_plan.world();
        second.argv = worker_argv(report.resume_backend, store);
        second.argv.insert(second.argv.end(), {"--resume-from", cp_dir, "--spec-file",
                                               req.run_dir + "/leg2.spec.json", "--plan-file",
                                               req.run_dir + "/leg2.plan.json"});
      }
      launched = launch(second);
      if (launched.ok) keep_leg(req.run_dir, second_plan.world(), "leg2");
      else
        launched.message = "second leg (" + report.resume_backend + " on " + std::to_string(second_plan.world()) +
                           " ranks, updates " + std::to_string(spec.resume.at) + ".." +
                           std::to_string(plan.windows.size() - 1) + "): " + launched.message;
    }
  } else {
    launched = launch(launch_req);
  }
  store.reset();
  LaunchedRunPtr run(new LaunchedRun{req, spec, plan, std::move(report), nonce, std::move(launched),
                                     std::move(incomplete), std::move(early), 0});
  run->launch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return run;
}

RunReport check_launched(LaunchedRunPtr run) {
  const auto t0 = std::chrono::steady_clock::now();
  const RunRequest& req = run->req;
  const Spec& spec = run->spec;
  const Plan& plan = run->plan;
  const bool external = req.backend == kExternalBackend;
  const LaunchResult& launched = run->launched;
  RunReport& report = run->report;
  report.interrupted = launched.interrupted;
  if (!launched.ok) {
    report.error = launched.message;
    if (external) {  // one launched process: the command, not a rank
      for (auto [from, to] : {std::pair<std::string, std::string>{"rank 0 ", "the external command "},
                              {"--- rank 0 log tail ---", "--- external command output (tail) ---"},
                              {"--- rank 0 output (its log", "--- external command output (its log"}})
        if (auto at = report.error.find(from); at != std::string::npos) report.error.replace(at, from.size(), to);
      report.error += stack_traceback(req.run_dir + "/rank0.log");
    }
  } else if (!run->incomplete.empty()) {
    CheckResult c;
    c.id = "resume.checkpoint";
    c.verdict = Verdict::Fail;
    c.figure = 1;
    c.detail = run->incomplete + " (the second leg was not started: nothing else is judged)";
    report.checks.push_back(c);
  } else {
    check_artifacts(report, req, spec, plan, run->nonce, req.run_dir, run->early.get());
  }
  if (!report.interrupted) report.interrupted = interrupt_signal();
  run->early.reset();  // its thread is joined and its spill removed before the run counts as checked
  report.wall_seconds =
      run->launch_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::move(report);
}

RunReport run_backend(const RunRequest& req) { return check_launched(launch_run(req)); }

CheckedRun check_run(const CheckRequest& c) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string& dir = c.run_dir;
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(dir, ec)))
    throw std::invalid_argument(dir + ": not a run folder (no such folder, or not a folder)");
  const RunRecord rec = read_run_record(dir);
  if (const std::string marker = dir + "/" + kRunFolderMarker; fs::exists(fs::symlink_status(marker, ec)))
    if (run_folder_nonce(dir) != rec.nonce)
      throw ArtifactError(dir + "/" + kRunRecordFile + ": field 'nonce' is not the run folder's (" + marker +
                          "): a run.json from another run?");
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
  const Spec spec = effective_spec(req);
  const Plan plan = make_plan(spec);
  validate_request(req, spec, plan);
  // The inputs the ranks consumed are the spec's (with --spec, only the plan's windows count).
  expect_input_file(dir + "/plan.json", nlohmann::json::parse(plan_to_json(plan, spec)), !c.spec_path.empty(),
                    "plan");
  if (req.backend == kExternalBackend)
    expect_input_file(dir + "/dataset.json", external_dataset(spec), false, "dataset");
  if (spec.resume.at > 0) {  // the second leg's inputs (NOTE [resume])
    const Spec second = second_leg_spec(spec);
    expect_input_file(dir + "/leg2.plan.json", nlohmann::json::parse(plan_to_json(make_plan(second), second)),
                      !c.spec_path.empty(), "second leg's plan");
  }

  RunReport report = report_of(req, spec, plan);
  report.checked_from = dir;
  if (needs_python_reference(spec)) {  // the runner's artifacts and log: never into the run folder
    fs::create_directories(c.work_dir, ec);
    if (ec) throw std::invalid_argument(c.work_dir + ": cannot create: " + ec.message());
  }
  check_artifacts(report, req, spec, plan, rec.nonce, c.work_dir);
  if (!report.interrupted) report.interrupted = interrupt_signal();
  report.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {spec, req.launcher, std::move(report)};
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
