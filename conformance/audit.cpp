#include "conformance/audit.hpp"
#include "conformance/memory.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <sys/wait.h>

#include "backends/registry.hpp"
#include "conformance/artifacts.hpp"
#include "conformance/plan.hpp"
#include "conformance/throughput.hpp"

namespace gradcert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------- names -> sides

struct Adapter {
  const char* alias;
  const char* name;  ///< command.sh's name
};
constexpr Adapter kAdapters[] = {{"fsdp1", "torch-fsdp1"}, {"fsdp2", "torch-fsdp2"}, {"torch-fsdp1", "torch-fsdp1"},
                                 {"torch-fsdp2", "torch-fsdp2"}, {"torch-ddp", "torch-ddp"}};

std::string shell_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

std::string adapter_command(const std::string& root, const std::string& adapter, const std::string& inject) {
  const std::string script = root + "/backends/python/command.sh";
  if (!fs::exists(script)) throw std::invalid_argument(script + " is missing (set GRADCERT_ROOT to the gradcert checkout)");
  if (!fs::exists(root + "/.venv/bin/torchrun"))
    throw std::invalid_argument(adapter + " needs " + root + "/.venv/bin/torchrun: run scripts/bootstrap for the venv");
  std::string cmd = "sh " + shell_quote(script) + " " + adapter;
  if (!inject.empty()) cmd += " --wrong " + shell_quote(inject);
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw std::invalid_argument("cannot run " + script);
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (status != 0) throw std::invalid_argument(script + " " + adapter + " failed: " + out);
  return out;
}


std::string loss_text(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.12g", x);
  return b;
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 0.1 ? "%.4f" : "%.3f", s);
  return b;
}

std::string mib(double bytes) { return human_bytes(bytes); }


/// Memory side by side, or why it is not shown.
std::string memory_text(const AuditSideFacts& b, const AuditSideFacts& a) {
  auto both = [](const std::optional<double>& x, const std::optional<double>& y) {
    return (x ? mib(*x) : std::string("not reported")) + " / " + (y ? mib(*y) : std::string("not reported"));
  };
  if (!b.peak_memory_bytes && !a.peak_memory_bytes && !b.model_state_bytes && !a.model_state_bytes)
    return "memory: neither stack reports it (external stacks: manifest peak_memory_bytes); step time only";
  auto kinds = [&] {
    if (b.peak_memory_kind == a.peak_memory_kind) return b.peak_memory_kind.empty() ? std::string() : " [" + b.peak_memory_kind + "]";
    return " [" + (b.peak_memory_kind.empty() ? std::string("?") : b.peak_memory_kind) + " / " +
           (a.peak_memory_kind.empty() ? std::string("?") : a.peak_memory_kind) + "]";
  };
  std::string t = "memory before / after: peak (worst rank) " + both(b.peak_memory_bytes, a.peak_memory_bytes) + kinds();
  if (b.model_state_bytes || a.model_state_bytes)
    t += "; model state (measured) " + both(b.model_state_bytes, a.model_state_bytes);
  return t;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// ---------------------------------------------------------------- reading a run

struct SideData {
  std::vector<BackendUpdate> updates;
  AuditSideFacts facts;
};

SideData read_side(const std::string& dir, const Plan& plan, int world, DType dtype) {
  SideData d;
  // Names and shapes: the run already passed the harness's strict read against the
  // reference's; the audit compares the two sides' names with each other below.
  const TensorMap shapes = read_safetensors(dir + "/u0.params.safetensors");
  d.updates = read_run(dir, plan, world, shapes, dtype);
  std::vector<double> steps;
  for (const auto& u : d.updates) steps.push_back(u.step_seconds);
  d.facts.step_seconds_median = median(steps);
  const json m = json::parse(read_text_file(dir + "/manifest.json"), nullptr, false);
  if (m.is_object()) {
    if (m.contains("backend") && m["backend"].is_string()) d.facts.manifest_backend = m["backend"];
    if (m.contains("versions") && m["versions"].is_object())
      for (auto it = m["versions"].begin(); it != m["versions"].end(); ++it)
        d.facts.versions[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    if (m.contains("notes")) d.facts.notes = m["notes"].is_string() ? m["notes"].get<std::string>() : m["notes"].dump();
    // A number, or one per rank (the worst counts).
    auto worst = [&](const char* key) -> std::optional<double> {
      if (!m.contains(key)) return std::nullopt;
      const json& v = m[key];
      if (v.is_number()) return v.get<double>();
      if (!v.is_array() || v.empty()) return std::nullopt;
      double mx = 0;
      for (const auto& x : v)
        if (x.is_number()) mx = std::max(mx, x.get<double>());
      return mx;
    };
    d.facts.peak_memory_bytes = worst("peak_memory_bytes");
    d.facts.model_state_bytes = worst("model_state_bytes");
    if (m.contains("peak_memory_kind") && m["peak_memory_kind"].is_string())
      d.facts.peak_memory_kind = m["peak_memory_kind"].get<std::string>();
  }
  return d;
}

/// Examples consumed per update: one record per DP rank (TP/PP peers see the same ids).
int64_t consumed_examples(const BackendUpdate& u) {
  std::set<int> seen;
  int64_t n = 0;
  for (const auto& r : u.ranks)
    if (seen.insert(r.dp_rank).second)
      for (const auto& mb : r.consumed) n += static_cast<int64_t>(mb.size());
  return n;
}

// ---------------------------------------------------------------- migration notes

std::string family(const std::string& label) {
  for (const char* f : {"torch-fsdp1", "torch-fsdp2", "torch-ddp"})
    if (label.rfind(f, 0) == 0) return f;
  return label;
}

/// How a stack reduces gradients (for the generic notes).
std::string reduction_of(const std::string& f) {
  if (f == "torch-ddp") return "DDP: bucketed all-reduce, averaged over D";
  if (f == "torch-fsdp1") return "FSDP1: reduce-scatter of each unit's FlatParameter, pre/post divide factors (product D)";
  if (f == "torch-fsdp2") return "FSDP2: per-parameter reduce-scatter of DTensor shards, divide factor D (ReduceOp.AVG or pre/post SUM)";
  if (f == "single") return "none (one process, D = 1)";
  if (f == "ddp") return "one flat all-reduce per window (divide by D, then SUM)";
  if (f == "zero1") return "ZeRO-1: all-reduce, optimizer state sharded (flat shards), parameters all-gathered";
  if (f == "zero2") return "ZeRO-2: reduce-scatter of the flat gradient into shards, divide by D";
  if (f == "zero3") return "ZeRO-3: reduce-scatter; parameters sharded and all-gathered per use";
  if (f == "fsdp") return "gradcert's C++ FSDP: per-layer units, reduce-scatter after each unit's backward";
  if (f == "tp") return "Megatron TP x DP: all-reduce over the DP group; TP-partitioned tensors";
  if (f == "pp") return "pipeline stages x DP: all-reduce over the DP group per stage";
  return "the stack's own (external)";
}

/// How a stack skips gradient sync while it accumulates over the window's microsteps.
std::string sync_of(const std::string& f) {
  if (f == "torch-ddp" || f == "torch-fsdp1") return "model.no_sync() on microsteps 0..A-2";
  if (f == "torch-fsdp2") return "model.set_requires_gradient_sync(False) on microsteps 0..A-2";
  if (f == "single") return "no reduction (D = 1)";
  if (f == "ddp" || f == "zero1" || f == "zero2" || f == "zero3")
    return "accumulates locally, one reduction after microstep A-1";
  if (f == "fsdp") return "no skipping: reduce-scatter after each unit's backward on every microstep";
  if (f == "tp" || f == "pp") return "see backends/" + f + ".cpp";
  return "the stack's own";
}

/// Whether the forward all-gathers sharded parameters (so empty ranks must run every microstep).
bool gathers_params(const std::string& f) {
  return f == "torch-fsdp1" || f == "torch-fsdp2" || f == "zero3" || f == "fsdp";
}

bool shards(const std::string& f) {
  return f == "torch-fsdp1" || f == "torch-fsdp2" || f == "zero1" || f == "zero2" || f == "zero3" || f == "fsdp";
}

}  // namespace

std::vector<MigrationNote> migration_notes(const std::string& before_label, const std::string& after_label,
                                           const Spec& spec, const Plan& plan) {
  const std::string b = family(before_label), a = family(after_label);
  const bool bf16 = spec.dtype == DType::BFloat16;
  const int D = plan.dp, A = plan.accum;
  bool empty_slots = false;
  for (const auto& w : plan.windows)
    for (const auto& r : w.slots)
      for (const auto& mb : r) empty_slots = empty_slots || mb.ids.empty();
  const std::string dt = dtype_name(spec.dtype);
  std::vector<MigrationNote> out;
  const bool fsdp_pair = (b == "torch-fsdp1" && a == "torch-fsdp2") || (b == "torch-fsdp2" && a == "torch-fsdp1");
  if (fsdp_pair) {
    const bool fwd = b == "torch-fsdp1";
    auto add = [&](std::string id, std::string topic, std::string v1, std::string v2, bool applies, std::string why) {
      out.push_back({std::move(id), std::move(topic), fwd ? v1 : v2, fwd ? v2 : v1, applies, std::move(why)});
    };
    add("reduce-dtype", "gradient reduce dtype under mixed precision",
        "MixedPrecision(param_dtype, reduce_dtype, buffer_dtype); reduce_dtype defaults to param_dtype",
        "MixedPrecisionPolicy(param_dtype, reduce_dtype, output_dtype); reduce_dtype None = param_dtype; "
        "sharded parameters stay fp32",
        bf16,
        bf16 ? "bfloat16: both sides compute and reduce gradients in bf16 with fp32 master weights; grad.parity "
               "and the diff below are held to the bfloat16 tolerance"
             : dt + " runs without a mixed-precision policy: not exercised (rerun with --dtype bfloat16)");
    add("divide-factor", "gradient divide factor",
        "divides the reduce-scattered gradient by pre- and post-divide factors of the world size (product D)",
        "divides by D once: ReduceOp.AVG, or pre/post division around a SUM (float64); "
        "set_gradient_divide_factor() overrides it",
        D > 1,
        D > 1 ? "D = " + std::to_string(D) + ": every update's gradient is divided on both sides; a wrong factor "
                    "shows as a constant ratio in grad rel L2 (every tensor)"
              : "D = 1: no reduction, not exercised");
    add("grad-sync", "skipping gradient sync during accumulation", "model.no_sync() context on microsteps 0..A-2",
        "model.set_requires_gradient_sync(False) on microsteps 0..A-2 (True on the last; recurse=True)", A > 1,
        A > 1 ? "A = " + std::to_string(A) + ": microsteps 0.." + std::to_string(A - 2) +
                    " accumulate unreduced gradients on both sides; a sync left off (or on) shows in grad.parity"
              : "A = 1: no accumulation, not exercised");
    add("state-dict", "state dict / checkpoint format",
        "state_dict_type(FULL_STATE_DICT | SHARDED_STATE_DICT); full tensors via summon_full_params",
        "DTensor shards; get_model_state_dict / torch.distributed.checkpoint; full tensors via full_tensor()", false,
        "not exercised: each stack gathers full tensors for the artifacts; no checkpoint is saved or loaded");
    add("flat-params", "parameter sharding",
        "FlatParameter per FSDP unit (use_orig_params=True keeps the original names for the optimizer)",
        "per-parameter DTensor sharding on dim 0; the optimizer steps the local shards", true,
        "both sides shard; gradients and parameters are compared per canonical tensor, so a name, shape or "
        "shard-layout change shows in the per-tensor table" +
            std::string(spec.optimizer.name == "adamw" ? "; AdamW state lives on the shards" : ""));
    add("empty-microbatch", "ranks with an empty microbatch", "must run a (zero-loss) forward/backward on every microstep",
        "the same: the forward all-gathers parameters on every microstep", empty_slots,
        empty_slots ? "the plan has empty microbatches (the partial final window): exercised"
                    : "every microbatch holds examples: not exercised");
    return out;
  }
  if (b == a) return out;
  out.push_back({"reduction", "gradient reduction", reduction_of(b), reduction_of(a), D > 1,
                 D > 1 ? "D = " + std::to_string(D) + ": exercised on every update"
                       : "D = 1: no reduction, not exercised"});
  out.push_back({"grad-sync", "skipping gradient sync during accumulation", sync_of(b), sync_of(a), A > 1,
                 A > 1 ? "A = " + std::to_string(A) + ": exercised" : "A = 1: not exercised"});
  out.push_back({"reduce-dtype", "gradient reduce dtype under mixed precision", "", "", bf16,
                 bf16 ? "bfloat16: exercised, held to the bfloat16 tolerance"
                      : dt + ": not exercised (rerun with --dtype bfloat16)"});
  if (shards(b) != shards(a))
    out.push_back({"sharding", "parameter / optimizer-state sharding", shards(b) ? "sharded" : "replicated",
                   shards(a) ? "sharded" : "replicated", true, "compared per canonical tensor below"});
  if (gathers_params(b) != gathers_params(a))
    out.push_back({"empty-microbatch", "ranks with an empty microbatch",
                   gathers_params(b) ? "run a zero-loss forward/backward on every microstep (the forward all-gathers)"
                                     : "join the gradient reduction only",
                   gathers_params(a) ? "run a zero-loss forward/backward on every microstep (the forward all-gathers)"
                                     : "join the gradient reduction only",
                   empty_slots,
                   empty_slots ? "the plan has empty microbatches (the partial final window): exercised"
                               : "every microbatch holds examples: not exercised"});
  return out;
}

AuditSide resolve_audit_side(const std::string& name, const std::string& inject_opt, const std::string& root) {
  AuditSide s;
  s.name = name;
  std::string base = name, inject = inject_opt;
  if (name.rfind("external:", 0) != 0) {
    if (auto at = name.find("+inject="); at != std::string::npos) {
      base = name.substr(0, at);
      if (!inject.empty() && inject != name.substr(at + 8))
        throw std::invalid_argument("'" + name + "' and --*-inject '" + inject + "' disagree");
      inject = name.substr(at + 8);
    }
  }
  if (base.rfind("external:", 0) == 0) {
    s.label = kExternalBackend;
    s.backend = kExternalBackend;
    s.command = base.substr(9);
    if (s.command.empty()) throw std::invalid_argument("external:<command>: the command is empty");
    if (!inject.empty()) throw std::invalid_argument("a planted bug applies to built-in backends and the adapters only");
    return s;
  }
  for (const auto& a : kAdapters)
    if (base == a.alias) {
      if (!inject.empty() && inject != "local-mean")
        throw std::invalid_argument("adapter " + std::string(a.name) + " plants only local-mean (--wrong), not '" +
                                    inject + "'");
      s.label = a.name;
      s.backend = kExternalBackend;
      s.inject = inject;
      s.command = adapter_command(root.empty() ? locate_repo_root("") : root, a.name, inject);
      return s;
    }
  const auto names = backend_names();
  if (std::find(names.begin(), names.end(), base) == names.end()) {
    std::string known;
    for (const auto& n : names) known += n + " ";
    throw std::invalid_argument("unknown backend '" + base + "' (built-in: " + known +
                                "; PyTorch adapters: fsdp1 fsdp2 torch-ddp; any stack: external:<command>)");
  }
  s.label = base;
  s.backend = base;
  s.inject = inject;
  return s;
}

std::string locate_repo_root(const std::string& exe) {
  if (const char* e = std::getenv("GRADCERT_ROOT"); e && *e) return e;
  auto ok = [](const fs::path& p) { return fs::exists(p / "backends/python/command.sh"); };
  std::error_code ec;
  fs::path p = exe.empty() ? fs::read_symlink("/proc/self/exe", ec) : fs::weakly_canonical(exe, ec);
  if (!ec) {
    p = p.parent_path();  // build/
    for (int i = 0; i < 4 && !p.empty(); ++i, p = p.parent_path()) {
      if (ok(p)) return p.string();
      if (p == p.root_path()) break;
    }
  }
  if (ok(fs::current_path(ec))) return fs::current_path(ec).string();
  throw std::invalid_argument("cannot find the gradcert checkout (backends/python/command.sh) above " +
                              (exe.empty() ? std::string("the executable") : exe) + ": set GRADCERT_ROOT");
}

namespace {
std::string side_title(const AuditSide& s);
}  // namespace

std::string AuditReport::verdict_text() const {
  if (preserved()) return "the migration preserves training semantics";
  return std::to_string(differences.size()) + " difference" + (differences.size() == 1 ? "" : "s");
}

AuditReport run_audit(const AuditRequest& q, std::ostream& progress) {
  AuditReport rep;
  const std::string root = q.root.empty() ? std::string() : q.root;
  auto resolve = [&](const std::string& name, const std::string& inject) {
    // Adapters need the checkout; built-ins and external:<command> do not.
    std::string r = root;
    if (r.empty())
      for (const auto& a : kAdapters)
        if (name == a.alias || name.rfind(std::string(a.alias) + "+", 0) == 0) r = locate_repo_root(q.exe);
    return resolve_audit_side(name, inject, r);
  };
  rep.before_side = resolve(q.before, q.before_inject);
  rep.after_side = resolve(q.after, q.after_inject);

  auto request = [&](const AuditSide& s, const std::string& role) {
    RunRequest r;
    r.spec = q.spec;
    r.backend = s.backend;
    r.world = q.world;
    r.launcher = q.launcher;
    r.inject = s.backend == kExternalBackend ? "" : s.inject;
    r.command = s.command;
    r.exe = q.exe;
    const Spec eff = effective_spec(r);
    std::string dir = role + "-" + s.label + "-w" + std::to_string(eff.topology.world()) + "-" +
                      dtype_name(eff.dtype) + "-" + eff.optimizer.name;
    if (!s.inject.empty()) dir += "-" + s.inject;
    r.run_dir = q.out_dir + "/runs/" + dir;
    return r;
  };
  const RunRequest rb = request(rep.before_side, "before"), ra = request(rep.after_side, "after");
  const Spec spec = effective_spec(rb);
  const Plan plan = make_plan(spec);
  rep.tolerance = spec.parity_tolerance();
  rep.spec_json = spec_to_json(spec);
  rep.notes = migration_notes(rep.before_side.label, rep.after_side.label, spec, plan);

  auto run_side = [&](const RunRequest& r, const AuditSide& s, const std::string& role, int k) {
    RunReport out = run_backend(r);
    out.inject = s.inject;  // adapters: the --wrong flag (the harness sees a plain external run)
    char line[512];
    std::snprintf(line, sizeof line, "# [%d/2] %-6s %-12s world %d %-8s %-5s %s (%.1f s)\n", k, role.c_str(),
                  side_title(s).c_str(), out.topology.world(),
                  out.dtype.c_str(), out.optimizer.c_str(),
                  !out.error.empty() ? "RUN FAILED" : (out.passed() ? "pass" : "FAIL"), out.wall_seconds);
    progress << line << std::flush;
    return out;
  };
  rep.before = run_side(rb, rep.before_side, "before", 1);
  rep.after = run_side(ra, rep.after_side, "after", 2);
  rep.environment = make_environment(spec.seed, spec.topology.world(), q.launcher);

  auto& diff = rep.differences;
  for (const auto* side : {&rep.before, &rep.after}) {
    const std::string who = side == &rep.before ? "before (" + rep.before_side.name + ")"
                                                : "after (" + rep.after_side.name + ")";
    if (!side->error.empty()) diff.push_back(who + ": run failed: " + first_line(side->error));
    for (const auto& c : side->checks)
      if (c.verdict == Verdict::Fail) diff.push_back(who + ": check " + c.id + " failed: " + c.detail);
  }
  // Memory and throughput the harness measured (built-in backends) or the manifest carries.
  auto measured = [](const RunReport& r, AuditSideFacts& f) {
    if (r.has_memory) {
      if (r.memory.measured_model_state_bytes >= 0) f.model_state_bytes = double(r.memory.measured_model_state_bytes);
      for (const auto& p : r.memory.peaks)
        f.peak_memory_bytes = std::max(f.peak_memory_bytes.value_or(0.0), double(p.peak_bytes));
      f.peak_memory_kind = "tracked tensor peak";
    }
    if (r.has_throughput && r.throughput.target_tokens_per_s > 0) f.target_tokens_per_s = r.throughput.target_tokens_per_s;
  };
  measured(rep.before, rep.before_facts);
  measured(rep.after, rep.after_facts);
  rep.memory = memory_text(rep.before_facts, rep.after_facts);
  if (rep.run_failed()) return rep;

  SideData before, after;
  try {
    before = read_side(rb.run_dir, plan, plan.world(), spec.dtype);
    after = read_side(ra.run_dir, plan, plan.world(), spec.dtype);
  } catch (const ArtifactError& e) {
    diff.push_back(std::string("cannot compare the two runs: ") + e.what());
    return rep;
  }
  auto merge = [](AuditSideFacts& into, const AuditSideFacts& from) {  // keep what the harness measured
    const auto peak = into.peak_memory_bytes;
    const auto state = into.model_state_bytes;
    const auto rate = into.target_tokens_per_s;
    const auto kind = into.peak_memory_kind;
    into = from;
    if (peak) into.peak_memory_bytes = peak;
    if (state) into.model_state_bytes = state;
    if (!kind.empty()) into.peak_memory_kind = kind;
    into.target_tokens_per_s = rate;
  };
  merge(rep.before_facts, before.facts);
  merge(rep.after_facts, after.facts);
  // external:<command> running one of the adapters: its manifest names it.
  auto manifest_label = [](const AuditSide& s, const AuditSideFacts& f) {
    auto it = f.versions.find("adapter");
    return s.label == kExternalBackend && it != f.versions.end() ? it->second : s.label;
  };
  rep.notes = migration_notes(manifest_label(rep.before_side, rep.before_facts),
                              manifest_label(rep.after_side, rep.after_facts), spec, plan);
  // What the stacks themselves say about these points (the adapters' manifest "notes").
  for (auto& n : rep.notes) {
    const char* key = n.id == "divide-factor" ? "divide" : n.id == "grad-sync" ? "sync" : nullptr;
    if (!key) continue;
    auto clause = [&](const std::string& notes) {
      std::stringstream ss(notes);
      std::string part;
      while (std::getline(ss, part, ';'))
        if (part.find(key) != std::string::npos) return part.substr(part.find_first_not_of(' '));
      return std::string();
    };
    const std::string cb = clause(rep.before_facts.notes), ca = clause(rep.after_facts.notes);
    if (!cb.empty() || !ca.empty())
      n.why += "; the stacks' manifests: before \"" + (cb.empty() ? "-" : cb) + "\", after \"" + (ca.empty() ? "-" : ca) + "\"";
  }
  rep.memory = memory_text(rep.before_facts, rep.after_facts);
  rep.compared = true;

  // Side by side per update: examples, N, loss, step time.
  for (size_t u = 0; u < plan.windows.size(); ++u) {
    const auto &b = before.updates[u], &a = after.updates[u];
    AuditUpdate au{static_cast<int>(u), consumed_examples(b), consumed_examples(a), b.valid_targets, a.valid_targets,
                   b.loss, a.loss, b.step_seconds, a.step_seconds};
    rep.updates.push_back(au);
    const std::string at = "update " + std::to_string(u) + ": ";
    if (au.batch_before != au.batch_after)
      diff.push_back(at + "B_update differs: before " + std::to_string(au.batch_before) + " examples, after " +
                     std::to_string(au.batch_after));
    if (au.n_before != au.n_after)
      diff.push_back(at + "N differs: before " + std::to_string(au.n_before) + ", after " + std::to_string(au.n_after));
    const double lrel = std::fabs(a.loss - b.loss) / std::max(std::fabs(b.loss), 1e-300);
    if (!(lrel <= rep.tolerance))
      diff.push_back(at + "loss differs: before " + loss_text(b.loss) + ", after " + loss_text(a.loss) + " (rel " + figure_text(lrel) +
                     " > " + figure_text(rep.tolerance) + ")");
  }

  // Per tensor and update: after vs before.
  struct Worst {
    double rel = -1, abs = 0;
    std::string where;
  } wg, wp;
  auto track = [](Worst& w, double rel, double abs, const std::string& where) {
    if (std::isnan(rel) || rel > w.rel) w = {rel, abs, where};
  };
  for (size_t u = 0; u < plan.windows.size(); ++u) {
    const auto &b = before.updates[u], &a = after.updates[u];
    const std::string at = "update " + std::to_string(u) + ": ";
    for (const auto& [name, bt] : b.grads) {
      AuditTensorDiff d;
      d.update = static_cast<int>(u);
      d.name = name;
      auto ag = a.grads.find(name);
      auto ap = a.params_after.find(name);
      auto bp = b.params_after.find(name);
      if (ag == a.grads.end() || ap == a.params_after.end() || bp == b.params_after.end()) {
        diff.push_back(at + "tensor '" + name + "' is missing on the after side");
        continue;
      }
      try {
        const TensorError ge = compare_tensors(ag->second, bt), pe = compare_tensors(ap->second, bp->second);
        d.grad_rel = ge.relative;
        d.grad_max_abs = ge.max_abs;
        d.param_rel = pe.relative;
        d.param_max_abs = pe.max_abs;
      } catch (const ArtifactError& e) {
        diff.push_back(at + e.what());
        continue;
      }
      track(wg, d.grad_rel, d.grad_max_abs, "update " + std::to_string(u) + " " + name);
      track(wp, d.param_rel, d.param_max_abs, "update " + std::to_string(u) + " " + name);
      rep.diffs.push_back(d);
    }
    for (const auto& [name, t] : a.grads)
      if (!b.grads.count(name)) diff.push_back(at + "tensor '" + name + "' is missing on the before side");
  }
  if (!(wg.rel <= rep.tolerance) && wg.rel >= 0)
    diff.push_back("gradients differ between the two sides: worst " + wg.where + ": rel L2 " + figure_text(wg.rel) +
                   ", max abs " + figure_text(wg.abs) + " (tolerance " + figure_text(rep.tolerance) + ")");
  if (!(wp.rel <= rep.tolerance) && wp.rel >= 0)
    diff.push_back("parameters differ between the two sides: worst " + wp.where + ": rel L2 " + figure_text(wp.rel) +
                   ", max abs " + figure_text(wp.abs) + " (tolerance " + figure_text(rep.tolerance) + ")");

  return rep;
}

// ---------------------------------------------------------------- writers

namespace {

/// Worst figure per tensor over the updates (the console and Markdown tables).
std::vector<AuditTensorDiff> worst_per_tensor(const AuditReport& r) {
  std::map<std::string, AuditTensorDiff> w;
  for (const auto& d : r.diffs) {
    auto [it, fresh] = w.emplace(d.name, d);
    if (fresh) continue;
    auto& x = it->second;
    x.grad_rel = std::max(x.grad_rel, d.grad_rel);
    x.grad_max_abs = std::max(x.grad_max_abs, d.grad_max_abs);
    x.param_rel = std::max(x.param_rel, d.param_rel);
    x.param_max_abs = std::max(x.param_max_abs, d.param_max_abs);
  }
  std::vector<AuditTensorDiff> out;
  for (auto& [n, d] : w) out.push_back(d);
  return out;
}

std::string run_verdict(const RunReport& r) { return !r.error.empty() ? "error" : r.passed() ? "pass" : "fail"; }

const CheckResult* find_check(const RunReport& r, const std::string& id) {
  for (const auto& c : r.checks)
    if (c.id == id) return &c;
  return nullptr;
}

std::vector<std::string> check_ids(const AuditReport& r) {
  std::vector<std::string> ids;
  for (const auto* s : {&r.before, &r.after})
    for (const auto& c : s->checks)
      if (std::find(ids.begin(), ids.end(), c.id) == ids.end()) ids.push_back(c.id);
  return ids;
}

std::string side_title(const AuditSide& s) {
  if (s.name.rfind("external:", 0) == 0) return "external";
  std::string t = s.name;
  if (s.label != s.name && s.name.find("+inject=") == std::string::npos) t += " (" + s.label + ")";
  if (!s.inject.empty() && s.name.find("+inject=") == std::string::npos) t += " +inject=" + s.inject;
  return t;
}

std::string side_facts_line(const AuditSide& s, const AuditSideFacts& f) {
  std::string line = side_title(s) + ": ";
  if (s.backend == kExternalBackend) {
    std::string v;
    for (const auto& [k, val] : f.versions) v += (v.empty() ? "" : ", ") + k + " " + val;
    line += "external stack" + (v.empty() ? std::string() : " [" + v + "]");
    if (!f.notes.empty()) line += "; notes: " + f.notes;
  } else {
    line += "built-in gradcert backend (C++ on Gloo)";
    if (s.label == "fsdp") line += "; gradcert's own FSDP, not PyTorch FSDP1/FSDP2";
  }
  if (!s.inject.empty()) line += "; planted bug: " + s.inject;
  return line;
}

json side_json(const AuditSide& s, const RunReport& r, const AuditSideFacts& f) {
  json checks = json::array();
  for (const auto& c : r.checks)
    checks.push_back({{"id", c.id}, {"verdict", verdict_name(c.verdict)}, {"figure", json_number(c.figure)},
                      {"tolerance", json_number(c.tolerance)}, {"detail", c.detail}});
  json j = {{"name", s.name},
            {"label", s.label},
            {"backend", s.backend},
            {"command", s.command.empty() ? json(nullptr) : json(s.command)},
            {"inject", s.inject.empty() ? json(nullptr) : json(s.inject)},
            {"topology", {{"dp", r.topology.dp}, {"tp", r.topology.tp}, {"pp", r.topology.pp}}},
            {"dtype", r.dtype},
            {"optimizer", r.optimizer},
            {"updates", r.updates},
            {"update_batch", r.update_batch},
            {"verdict", run_verdict(r)},
            {"run_dir", r.run_dir},
            {"wall_seconds", r.wall_seconds},
            {"checks", checks},
            {"versions", f.versions},
            {"notes", f.notes.empty() ? json(nullptr) : json(f.notes)},
            {"step_seconds_median", f.step_seconds_median},
            {"peak_memory_bytes", f.peak_memory_bytes ? json(*f.peak_memory_bytes) : json(nullptr)},
            {"model_state_bytes", f.model_state_bytes ? json(*f.model_state_bytes) : json(nullptr)},
            {"target_tokens_per_s", f.target_tokens_per_s ? json(*f.target_tokens_per_s) : json(nullptr)}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}


std::string pad(const std::string& s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

std::string figure_or(const CheckResult* c) { return c ? figure_text(c->figure) : "-"; }
std::string verdict_or(const RunReport& r, const CheckResult* c) {
  if (!r.error.empty()) return "error";
  return c ? verdict_name(c->verdict) : "-";
}

}  // namespace

std::string audit_json(const AuditReport& r) {
  const auto& e = r.environment;
  json updates = json::array(), tensors = json::array(), worst = json::array(), notes = json::array();
  for (const auto& u : r.updates)
    updates.push_back({{"update", u.update},
                       {"update_batch", {{"before", u.batch_before}, {"after", u.batch_after}}},
                       {"valid_targets", {{"before", u.n_before}, {"after", u.n_after}}},
                       {"loss", {{"before", json_number(u.loss_before)}, {"after", json_number(u.loss_after)}}},
                       {"step_seconds", {{"before", u.step_before}, {"after", u.step_after}}}});
  auto tensor_json = [](const AuditTensorDiff& d, bool with_update) {
    json j = {{"name", d.name},
              {"grad", {{"rel_l2", json_number(d.grad_rel)}, {"max_abs", json_number(d.grad_max_abs)}}},
              {"params", {{"rel_l2", json_number(d.param_rel)}, {"max_abs", json_number(d.param_max_abs)}}}};
    if (with_update) j["update"] = d.update;
    return j;
  };
  for (const auto& d : r.diffs) tensors.push_back(tensor_json(d, true));
  for (const auto& d : worst_per_tensor(r)) worst.push_back(tensor_json(d, false));
  for (const auto& n : r.notes)
    notes.push_back({{"id", n.id}, {"topic", n.topic}, {"before", n.before}, {"after", n.after},
                     {"applies", n.applies}, {"why", n.why}});
  json j = {{"schema", "gradcert.audit/1"},
            {"environment", {{"torch", e.torch}, {"device", e.device}, {"world", e.world}, {"launcher", e.launcher},
                             {"git", e.git}, {"seed", e.seed}, {"host", e.host}, {"started", e.started}}},
            {"spec", json::parse(r.spec_json.empty() ? "{}" : r.spec_json, nullptr, false)},
            {"before", side_json(r.before_side, r.before, r.before_facts)},
            {"after", side_json(r.after_side, r.after, r.after_facts)},
            {"tolerance", json_number(r.tolerance)},
            {"compared", r.compared},
            {"updates", updates},
            {"tensors", tensors},
            {"tensors_worst", worst},
            {"step_seconds_median", {{"before", r.before_facts.step_seconds_median},
                                     {"after", r.after_facts.step_seconds_median}}},
            {"memory", r.memory},
            {"migration_notes", notes},
            {"differences", r.differences},
            {"verdict", r.run_failed() ? "error" : r.preserved() ? "preserved" : "differences"},
            {"verdict_text", r.verdict_text()}};
  return j.dump(1) + "\n";
}

std::string audit_table(const AuditReport& r) {
  std::ostringstream o;
  const auto& b = r.before;
  o << "# gradcert audit: before " << side_title(r.before_side) << " -> after " << side_title(r.after_side)
    << ", world " << b.topology.world() << " (dp " << b.topology.dp << " tp " << b.topology.tp << " pp "
    << b.topology.pp << "), " << b.dtype << " " << b.optimizer << ", " << b.updates << " updates, B_update "
    << b.update_batch << "\n";
  o << "#  " << side_facts_line(r.before_side, r.before_facts) << "\n";
  o << "#  " << side_facts_line(r.after_side, r.after_facts) << "\n";
  o << "#check                    " << pad("before", 10, true) << pad("after", 10, true) << pad("tolerance", 11, true)
    << "  verdict (before / after)\n";
  for (const auto& id : check_ids(r)) {
    const CheckResult *cb = find_check(r.before, id), *ca = find_check(r.after, id);
    const CheckResult* any = cb ? cb : ca;
    o << " " << pad(id, 24) << " " << pad(figure_or(cb), 10, true) << pad(figure_or(ca), 10, true)
      << pad(any && any->tolerance != 0 ? figure_text(any->tolerance) : "exact", 11, true) << "  "
      << verdict_or(r.before, cb) << " / " << verdict_or(r.after, ca) << "\n";
  }
  for (const auto* s : {&r.before, &r.after})
    if (!s->error.empty())
      o << "# " << (s == &r.before ? "before" : "after") << " run failed: " << first_line(s->error) << "\n";
  if (r.compared) {
    o << "#update  B_update (before/after)  N (before/after)   loss before   loss after   step s before/after\n";
    for (const auto& u : r.updates) {
      char line[256];
      std::snprintf(line, sizeof line, " %-7d %9lld / %-9lld %7lld / %-7lld %13.6e %12.6e   %s / %s\n", u.update,
                    static_cast<long long>(u.batch_before), static_cast<long long>(u.batch_after),
                    static_cast<long long>(u.n_before), static_cast<long long>(u.n_after), u.loss_before,
                    u.loss_after, seconds(u.step_before).c_str(), seconds(u.step_after).c_str());
      o << line;
    }
    o << "#tensor (after vs before, worst update)  grad rel L2  grad max abs  param rel L2  param max abs\n";
    for (const auto& d : worst_per_tensor(r))
      o << " " << pad(d.name, 38) << " " << pad(figure_text(d.grad_rel), 11, true) << " " << pad(figure_text(d.grad_max_abs), 13, true)
        << " " << pad(figure_text(d.param_rel), 13, true) << " " << pad(figure_text(d.param_max_abs), 14, true) << "\n";
    o << "# tolerance (spec, " << b.dtype << "): " << figure_text(r.tolerance) << "\n";
    o << "# step time (median over updates): before " << seconds(r.before_facts.step_seconds_median)
      << " s, after " << seconds(r.after_facts.step_seconds_median) << " s";
    if (r.before_facts.step_seconds_median > 0 && r.after_facts.step_seconds_median > 0) {
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, " (after/before x%.2f)",
                    r.after_facts.step_seconds_median / r.before_facts.step_seconds_median);
      o << ratio;
    }
    if (r.before_facts.target_tokens_per_s || r.after_facts.target_tokens_per_s) {
      auto rate = [](const std::optional<double>& x) { return x ? figure_text(std::round(*x)) : std::string("-"); };
      o << "; target tokens/s " << rate(r.before_facts.target_tokens_per_s) << " / "
        << rate(r.after_facts.target_tokens_per_s);
    }
    o << "\n# " << r.memory << "\n";
  }
  if (!r.notes.empty()) {
    o << "# what commonly changes in this migration ([x] exercised by this run, [ ] not):\n";
    for (const auto& n : r.notes) {
      o << "#  [" << (n.applies ? "x" : " ") << "] " << n.id << ": " << n.topic << "\n";
      if (!n.before.empty()) o << "#        before: " << n.before << "\n";
      if (!n.after.empty()) o << "#        after:  " << n.after << "\n";
      o << "#        " << n.why << "\n";
    }
  }
  if (r.preserved()) {
    o << "# verdict: the migration preserves training semantics\n# OK\n";
  } else {
    o << "# verdict: " << r.verdict_text() << "\n";
    for (const auto& d : r.differences) o << "#  - " << d << "\n";
    o << "# FAILED\n";
  }
  return o.str();
}

std::string audit_markdown(const AuditReport& r) {
  std::ostringstream o;
  const auto& b = r.before;
  o << "# gradcert migration audit: `" << r.before_side.name << "` -> `" << r.after_side.name << "`\n\n";
  o << "**Verdict: " << (r.preserved() ? "the migration preserves training semantics" : r.verdict_text()) << "**\n\n";
  if (!r.differences.empty()) {
    for (const auto& d : r.differences) o << "- " << d << "\n";
    o << "\n";
  }
  o << "World " << b.topology.world() << " (dp " << b.topology.dp << ", tp " << b.topology.tp << ", pp "
    << b.topology.pp << "), " << b.dtype << ", " << b.optimizer << ", " << b.updates << " updates, B_update "
    << b.update_batch << "; parity tolerance " << figure_text(r.tolerance) << ". torch " << r.environment.torch << ", git "
    << r.environment.git << ", " << r.environment.started << ".\n\n";
  o << "- before: " << side_facts_line(r.before_side, r.before_facts) << "\n";
  o << "- after: " << side_facts_line(r.after_side, r.after_facts) << "\n\n";
  o << "## Checks against the float64 reference\n\n| check | before | after | tolerance | verdict (before / after) |\n"
       "|---|---|---|---|---|\n";
  for (const auto& id : check_ids(r)) {
    const CheckResult *cb = find_check(r.before, id), *ca = find_check(r.after, id);
    const CheckResult* any = cb ? cb : ca;
    o << "| `" << id << "` | " << figure_or(cb) << " | " << figure_or(ca) << " | "
      << (any && any->tolerance != 0 ? figure_text(any->tolerance) : "exact") << " | " << verdict_or(r.before, cb) << " / "
      << verdict_or(r.after, ca) << " |\n";
  }
  for (const auto* s : {&r.before, &r.after})
    if (!s->error.empty())
      o << "\n" << (s == &r.before ? "Before" : "After") << " run failed:\n\n```\n" << s->error << "\n```\n";
  if (r.compared) {
    o << "\n## Per update\n\n| update | B_update before / after | N before / after | loss before | loss after | "
         "step s before / after |\n|---|---|---|---|---|---|\n";
    for (const auto& u : r.updates) {
      char l1[64], l2[64];
      std::snprintf(l1, sizeof l1, "%.10e", u.loss_before);
      std::snprintf(l2, sizeof l2, "%.10e", u.loss_after);
      o << "| " << u.update << " | " << u.batch_before << " / " << u.batch_after << " | " << u.n_before << " / "
        << u.n_after << " | " << l1 << " | " << l2 << " | " << seconds(u.step_before) << " / "
        << seconds(u.step_after) << " |\n";
    }
    o << "\nStep time (median): before " << seconds(r.before_facts.step_seconds_median) << " s, after "
      << seconds(r.after_facts.step_seconds_median) << " s. " << r.memory << ".\n";
    o << "\n## Per tensor: after vs before (worst over updates)\n\n| tensor | grad rel L2 | grad max abs | "
         "param rel L2 | param max abs |\n|---|---|---|---|---|\n";
    for (const auto& d : worst_per_tensor(r))
      o << "| `" << d.name << "` | " << figure_text(d.grad_rel) << " | " << figure_text(d.grad_max_abs) << " | " << figure_text(d.param_rel)
        << " | " << figure_text(d.param_max_abs) << " |\n";
  }
  if (!r.notes.empty()) {
    o << "\n## What commonly changes in this migration\n\n| | change | before | after | this run |\n"
         "|---|---|---|---|---|\n";
    for (const auto& n : r.notes)
      o << "| " << (n.applies ? "exercised" : "not exercised") << " | " << n.topic << " (`" << n.id << "`) | "
        << n.before << " | " << n.after << " | " << n.why << " |\n";
  }
  return o.str();
}

std::string audit_junit(const AuditReport& r) {
  std::ostringstream cases;
  int tests = 0, failures = 0, errors = 0;
  auto add = [&](const std::string& cls, const std::string& name, const std::string& kind, const std::string& msg) {
    ++tests;
    cases << "  <testcase classname=\"" << xml_escape(cls) << "\" name=\"" << xml_escape(name) << "\"";
    if (kind.empty()) {
      cases << "/>\n";
      return;
    }
    (kind == "error" ? errors : failures)++;
    cases << ">\n    <" << kind << " message=\"" << xml_escape(first_line(msg)) << "\">" << xml_escape(msg) << "</"
          << kind << ">\n  </testcase>\n";
  };
  for (const auto* s : {&r.before, &r.after}) {
    const std::string cls = "audit." + std::string(s == &r.before ? "before." : "after.") +
                            (s == &r.before ? r.before_side.name : r.after_side.name);
    if (!s->error.empty()) add(cls, "run", "error", s->error);
    for (const auto& c : s->checks)
      add(cls, c.id, c.verdict == Verdict::Fail ? "failure" : "",
          c.detail + " (figure " + figure_text(c.figure) + ", tolerance " + figure_text(c.tolerance) + ")");
  }
  if (r.compared) {
    std::map<std::string, std::string> found;  // "grads", "params", "window_count", "update_size", "loss"
    for (const auto& d : r.differences) {
      const std::string key = d.find("gradients differ") != std::string::npos   ? "grads"
                              : d.find("parameters differ") != std::string::npos ? "params"
                              : d.find("N differs") != std::string::npos         ? "window_count"
                              : d.find("B_update differs") != std::string::npos  ? "update_size"
                              : d.find("loss differs") != std::string::npos      ? "loss"
                              : d.find("tensor") != std::string::npos            ? "tensors"
                                                                                 : "";
      if (!key.empty()) found[key] += (found[key].empty() ? "" : "\n") + d;
    }
    for (const char* k : {"grads", "params", "window_count", "update_size", "loss", "tensors"})
      add("audit.between", k, found.count(k) ? "failure" : "", found.count(k) ? found[k] : "");
  }
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"gradcert.audit\" tests=\"" << tests
    << "\" failures=\"" << failures << "\" errors=\"" << errors << "\">\n"
    << cases.str() << "</testsuite>\n";
  return o.str();
}

void write_audit_files(const AuditReport& r, const std::string& dir) {
  fs::create_directories(dir);
  write_file_atomic(dir + "/audit.json", audit_json(r));
  write_file_atomic(dir + "/audit.md", audit_markdown(r));
  write_file_atomic(dir + "/junit.xml", audit_junit(r));
}

}  // namespace gradcert
