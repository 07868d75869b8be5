#include "conformance/run/run_plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <tuple>

#include "backends/catalog.hpp"
#include "backends/runtime/mutants.hpp"
#include "conformance/core/dataset.hpp"
#include "conformance/core/format.hpp"
#include "conformance/core/result.hpp"

namespace gradcert {

bool RunPlan::external() const { return request.backend == kExternalBackend; }

int RunPlan::widest_leg() const {
  int w = plan.world();
  for (const auto& leg : legs) w = std::max(w, leg.plan.world());
  return w;
}

Spec effective_spec(const RunRequest& req) {
  Spec s = req.spec;
  if (req.tp > 0) s.topology.tp = req.tp;
  if (req.pp > 0) s.topology.pp = req.pp;
  if (req.world > 0) s.topology.dp = data_parallel_degree(req.world, s.topology.tp, s.topology.pp);
  validate_spec(s);
  return s;
}

namespace {

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

}  // namespace

// The tiny LM's parameter count, in double (a d_model of 2^31 would overflow int64).

double tiny_lm_parameters(const ModelSpec& m) {
  const double d = m.d_model, f = m.d_ff, v = m.vocab, L = m.layers, T = m.max_len;
  return 2 * v * d + T * d + L * (4 * d * d + 2 * d * f + f + 6 * d) + 2 * d;
}

namespace {

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
                                    " parameters; the float64 reference alone needs at least " + human_bytes(need) +
                                    " (weights + gradients) and this machine has " + human_bytes(have) +
                                    " available: refused before any rank starts");
}

// resume.at must leave the second leg updates to run.
void validate_resume_at(const Spec& spec, const Plan& plan) {
  const int updates = static_cast<int>(plan.windows.size());
  if (spec.resume.at >= updates)
    throw std::invalid_argument("resume.at (--resume-at) is " + std::to_string(spec.resume.at) + ": the plan has " +
                                std::to_string(updates) + " updates, so it must be in 1.." +
                                std::to_string(updates - 1) + " (a second leg must have updates to run)");
}

// Bad input the run (or the check of its folder) refuses before anything runs: throws
// std::invalid_argument naming the option.
void validate_request(const RunPlan& p) {
  const RunRequest& req = p.request;
  const Spec& spec = p.spec;
  const Plan& plan = p.plan;
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
  const Plan& leg2 = p.legs.at(1).plan;
  auto resumed = make_backend(second);
  resumed->validate(leg2, leg2.world(), mutant);
  resumed->validate_model(spec.model, leg2);
}

}  // namespace

RunPlan make_run_plan(const RunRequest& req) {
  RunPlan p;
  p.request = req;
  p.spec = effective_spec(req);
  p.plan = make_plan(p.spec);
  refuse_oversized(p.spec);
  p.legs.push_back({p.spec, p.plan, 0});
  p.checked = p.plan;
  if (p.spec.resume.at > 0) {
    validate_resume_at(p.spec, p.plan);
    // second_leg_spec / resumed_plan throw SpecError naming resume.* when no batch split keeps B_update.
    const Spec second = second_leg_spec(p.spec);
    p.legs.push_back({second, make_plan(second), p.spec.resume.at});
    p.checked = resumed_plan(p.spec, p.plan, p.legs[1].plan);
  }
  validate_request(p);
  p.targets_of_id.resize(static_cast<size_t>(p.spec.dataset.size));
  for (int64_t id = 0; id < p.spec.dataset.size; ++id) p.targets_of_id[id] = make_sample(p.spec, id).valid_targets();
  return p;
}

}  // namespace gradcert
