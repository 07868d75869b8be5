// The migration notes: what commonly changes between two stacks, and whether this run exercises it.
#include <sstream>

#include "backends/catalog.hpp"
#include "conformance/audit/audit.hpp"
#include "conformance/audit/sides.hpp"

namespace gradcert {

namespace {

// The adapters of the checkout this executable belongs to (none when it cannot be found:
// their notes then read "the stack's own").
const std::vector<AdapterInfo>& adapters() {
  static const std::vector<AdapterInfo> none;
  try {
    return adapter_catalog(locate_repo_root(""));
  } catch (const std::invalid_argument&) {
    return none;
  }
}

const AdapterInfo* adapter_of(const std::string& f) {
  for (const auto& a : adapters())
    if (a.name == f) return &a;
  return nullptr;
}

std::string family(const std::string& label) {
  for (const auto& a : adapters())
    if (label.rfind(a.name, 0) == 0) return a.name;
  return label;
}

/// How a stack reduces gradients (for the generic notes).
std::string reduction_of(const std::string& f) {
  if (const auto* a = adapter_of(f)) return a->reduction;
  for (const auto* s : strategies())
    if (s->name == f) return s->reduction;
  return "the stack's own (external)";
}

/// How a stack skips gradient sync while it accumulates over the window's microsteps.
std::string sync_of(const std::string& f) {
  if (const auto* a = adapter_of(f)) return a->sync;
  for (const auto* s : strategies())
    if (s->name == f) return s->sync;
  return "the stack's own";
}

/// Whether the forward all-gathers sharded parameters (so empty ranks must run every microstep).
bool gathers_params(const std::string& f) {
  for (const auto* s : strategies())
    if (s->name == f) return s->traits.gathers_params;
  const auto* a = adapter_of(f);
  return a && a->gathers_params;
}

bool shards(const std::string& f) {
  for (const auto* s : strategies())
    if (s->name == f)
      return s->sharding == Sharding::ZeRO1 || s->sharding == Sharding::ZeRO2 || s->sharding == Sharding::ZeRO3 ||
             s->sharding == Sharding::FSDP;
  const auto* a = adapter_of(f);
  return a && a->shards;
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
        D > 1 ? "D = " + std::to_string(D) +
                    ": every update's gradient is divided on both sides; a wrong factor "
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
        "not exercised: no checkpoint is saved or loaded (FSDP1 gathers full tensors for the artifacts, FSDP2 "
        "writes its DTensor shards)");
    add("flat-params", "parameter sharding",
        "FlatParameter per FSDP unit (use_orig_params=True keeps the original names for the optimizer)",
        "per-parameter DTensor sharding on dim 0; the optimizer steps the local shards", true,
        "both sides shard; gradients and parameters are compared per canonical tensor, so a name, shape or "
        "shard-layout change shows in the per-tensor table" +
            std::string(spec.optimizer.name == "adamw" ? "; AdamW state lives on the shards" : ""));
    add("empty-microbatch", "ranks with an empty microbatch",
        "must run a (zero-loss) forward/backward on every microstep",
        "the same: the forward all-gathers parameters on every microstep", empty_slots,
        empty_slots ? "the plan has empty microbatches (the partial final window): exercised"
                    : "every microbatch holds examples: not exercised");
    return out;
  }
  if (b == a) return out;
  out.push_back(
      {"reduction", "gradient reduction", reduction_of(b), reduction_of(a), D > 1,
       D > 1 ? "D = " + std::to_string(D) + ": exercised on every update" : "D = 1: no reduction, not exercised"});
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

}  // namespace gradcert
