#include "conformance/audit/audit.hpp"

#include "conformance/audit/compare.hpp"
#include "conformance/core/format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <sys/wait.h>

#include "backends/catalog.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/core/throughput.hpp"

namespace gradcert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

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
  if (!inject.empty()) cmd += " --mutant " + shell_quote(inject);
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
  for (const auto* s : strategies())
    if (s->name == f) return s->reduction;
  return "the stack's own (external)";
}

/// How a stack skips gradient sync while it accumulates over the window's microsteps.
std::string sync_of(const std::string& f) {
  if (f == "torch-ddp" || f == "torch-fsdp1") return "model.no_sync() on microsteps 0..A-2";
  if (f == "torch-fsdp2") return "model.set_requires_gradient_sync(False) on microsteps 0..A-2";
  for (const auto* s : strategies())
    if (s->name == f) return s->sync;
  return "the stack's own";
}

/// Whether the forward all-gathers sharded parameters (so empty ranks must run every microstep).
bool gathers_params(const std::string& f) {
  for (const auto* s : strategies())
    if (s->name == f) return s->traits.gathers_params;
  return f == "torch-fsdp1" || f == "torch-fsdp2";
}

bool shards(const std::string& f) {
  for (const auto* s : strategies())
    if (s->name == f)
      return s->sharding == Sharding::ZeRO1 || s->sharding == Sharding::ZeRO2 || s->sharding == Sharding::ZeRO3 ||
             s->sharding == Sharding::FSDP;
  return f == "torch-fsdp1" || f == "torch-fsdp2";
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

  RunComparison cmp = compare_runs(plan, before.updates, after.updates, rep.tolerance);
  rep.updates = std::move(cmp.updates);
  rep.diffs = std::move(cmp.diffs);
  diff.insert(diff.end(), cmp.differences.begin(), cmp.differences.end());
  return rep;
}

}  // namespace gradcert
