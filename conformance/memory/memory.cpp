#include "conformance/memory/memory.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace gradcert {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return b <= 0 ? a : (a + b - 1) / b; }

int64_t times(int64_t count, double bytes_per) { return count * static_cast<int64_t>(std::llround(bytes_per)); }

Recipe make_recipe(std::string name, double w, std::string wl, double g, std::string gl, double m, std::string ml,
                   double o, std::string ol, std::string note) {
  Recipe r;
  r.name = std::move(name);
  r.bytes = {w, g, m, o};
  r.weight_label = std::move(wl);
  r.grad_label = std::move(gl);
  r.master_label = std::move(ml);
  r.moment_label = std::move(ol);
  r.note = std::move(note);
  return r;
}

std::string short_dtype(DType d) { return dtype_facts(d).short_name; }

}  // namespace

std::vector<Recipe> named_recipes() {
  return {
      make_recipe("mixed-adam", 2, "bf16 weights", 2, "bf16 grads", 4, "fp32 master", 8, "two fp32 moments",
                  "mixed-precision Adam (the seed's default)"),
      make_recipe("fp32-adam", 4, "fp32 weights", 4, "fp32 grads", 0, "no master", 8, "two fp32 moments",
                  "full-precision Adam: the weights are the master"),
      make_recipe("fp32-grads-adam", 2, "bf16 weights", 4, "fp32 grads", 4, "fp32 master", 8, "two fp32 moments",
                  "mixed precision keeping fp32 gradients (DeepSpeed's estimator counts 18 B/param)"),
      make_recipe("sgd", 4, "fp32 weights", 4, "fp32 grads", 0, "no master", 0, "no state",
                  "plain SGD in fp32: no optimizer state"),
      make_recipe("sgd-momentum", 4, "fp32 weights", 4, "fp32 grads", 0, "no master", 4, "fp32 momentum",
                  "SGD with momentum in fp32: one buffer"),
  };
}

Recipe recipe_by_name(const std::string& name) {
  std::string names;
  for (const auto& r : named_recipes()) {
    if (r.name == name) return r;
    names += (names.empty() ? "" : ", ") + r.name;
  }
  throw std::invalid_argument("unknown recipe '" + name + "' (known: " + names + ")");
}

Recipe recipe_for_run(DType dtype, const OptimizerSpec& optimizer) {
  const double w = dtype_bytes(dtype);
  const bool master = dtype == DType::BFloat16;
  const double state = master ? 4 : w;  // slots live in the master's dtype
  const std::string sd = short_dtype(dtype), ss = master ? "fp32" : sd;
  double o = 0;
  std::string ol = "no state";
  if (optimizer.name == "adamw") {
    o = 2 * state;
    ol = "two " + ss + " moments";
  } else if (optimizer.momentum != 0) {
    o = state;
    ol = ss + " momentum";
  }
  const std::string name = dtype_name(dtype) + "-" + optimizer.name +
                           (optimizer.name == "sgd" && optimizer.momentum != 0 ? "-momentum" : "");
  return make_recipe(name, w, sd + " weights", w, sd + " grads", master ? 4 : 0, master ? "fp32 master" : "no master",
                     o, ol, "what a gradcert run of this dtype and optimizer keeps");
}

std::vector<std::string> excluded_from_estimate() {
  return {
      "activations (they grow with micro-batch x sequence length: see the measured peak per length bucket)",
      "logits (micro-batch x sequence x vocab, in the loss dtype)",
      "communication buffers (DDP gradient buckets, ZeRO/FSDP gather and reduce-scatter buffers; Gloo's "
      "reduce-scatter allocates a full-size extra buffer)",
      "optimizer-step temporaries (e.g. Adam's denominator, casts of gradients to the master dtype)",
      "allocator reserve (freed blocks a caching allocator keeps)",
      "fragmentation",
      "runtime context (CUDA context, kernels, libraries)",
  };
}

// NOTE [per-rank model state] The bound for the rank that holds the most, in whole
// parameters (shards round up, so every rank's share is covered):
//   P = params, T = trainable (P unless LoRA), L = layer_params (P unless given),
//   D = world / (tp x pp), s(x) = ceil(x / D).
//   Model parallelism first. TP splits the layer parameters and replicates the rest:
//   P_tp = ceil(L / tp) + (P - L). PP holds a stage; without the stage layout the bound
//   takes the average stage, P_r = ceil(P_tp / pp) (the heaviest stage holds at least that).
//   Full fine-tuning: T_r = P_r. LoRA: adapters sit in the layers, T_r = ceil(ceil(T / tp) / pp).
//   Then data parallelism over D replicas of that part:
//     single, ddp, tp, pp: weights P_r w, grads T_r g, master T_r m, moments T_r o (replicated)
//     zero1:  master s(T_r) m, moments s(T_r) o                (optimizer state and master sharded)
//     zero2:  also grads s(T_r) g                               (+ gradients)
//     zero3 / fsdp: also weights s(P_r) w                       (+ parameters)
//            + the largest gathered unit U (w + g) when D > 1 (U w for LoRA: the frozen base
//            has no gradients), as DeepSpeed's ZeRO-3 estimator counts it.
//   A flat shard (ZeRO, FSDP1) pads to D x s(x), so each rank holds exactly s(x); per-tensor
//   dim-0 sharding (FSDP2) gives some rank at least the mean, hence at least s(x) as well.
//   Frozen LoRA base parameters count only their weight bytes.
MemoryEstimate estimate_memory(const EstimateInput& in) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("estimate: " + what); };
  if (in.params <= 0) bad("--params must be positive");
  if (in.world < 1 || in.tp < 1 || in.pp < 1) bad("world, tp and pp must be at least 1");
  MemoryEstimate e;
  e.input = in;
  auto& x = e.input;
  // tp and pp are taken as given: tp = 1 under the tp strategy is TP = 1 x DP (a run of
  // `--backend tp --world 2 --tp 1`), not "unset". `gradcert estimate` resolves an unset
  // --tp / --pp to the strategy's default before it gets here.
  if (x.tp < 1 || x.pp < 1 || x.world % (x.tp * x.pp) != 0)
    bad("world " + std::to_string(x.world) + " is not a multiple of tp x pp = " + std::to_string(x.tp * x.pp));
  if (x.strategy == Sharding::Single && x.world != 1)
    bad("strategy single runs on one rank, not " + std::to_string(x.world));
  const int64_t P = x.params;
  const int64_t T = x.trainable < 0 ? P : x.trainable;
  const int64_t L = x.layer_params < 0 ? P : x.layer_params;
  if (T > P) bad("trainable parameters exceed the parameters");
  if (L > P) bad("layer parameters exceed the parameters");
  const bool lora = T < P;
  e.dp = x.world / (x.tp * x.pp);
  const int64_t D = e.dp;

  const int64_t p_tp = ceil_div(L, x.tp) + (P - L);
  e.rank_params = x.stage_params >= 0 ? x.stage_params : ceil_div(p_tp, x.pp);
  e.rank_trainable = lora ? std::min(e.rank_params, ceil_div(ceil_div(T, x.tp), x.pp)) : e.rank_params;

  const auto& r = x.recipe.bytes;
  const bool shard_state = x.strategy == Sharding::ZeRO1 || x.strategy == Sharding::ZeRO2 ||
                           x.strategy == Sharding::ZeRO3 || x.strategy == Sharding::FSDP;
  const bool shard_grads =
      x.strategy == Sharding::ZeRO2 || x.strategy == Sharding::ZeRO3 || x.strategy == Sharding::FSDP;
  const bool shard_weights = x.strategy == Sharding::ZeRO3 || x.strategy == Sharding::FSDP;
  const int64_t Pw = shard_weights ? ceil_div(e.rank_params, D) : e.rank_params;
  const int64_t Tg = shard_grads ? ceil_div(e.rank_trainable, D) : e.rank_trainable;
  const int64_t Ts = shard_state ? ceil_div(e.rank_trainable, D) : e.rank_trainable;
  e.weights = times(Pw, r.weight_bytes);
  e.grads = times(Tg, r.grad_bytes);
  e.master = times(Ts, r.master_bytes);
  e.moments = times(Ts, r.moment_bytes);
  if (shard_weights && D > 1)
    e.gathered_unit = times(x.largest_unit_params, r.weight_bytes + (lora ? 0 : r.grad_bytes));

  auto line = [&](const std::string& what, int64_t count, bool sharded, double b, int64_t bytes) {
    std::ostringstream o;
    o << what << ": " << count << " params x " << exact_text(b) << " B" << (sharded ? " (sharded over dp " : "")
      << (sharded ? std::to_string(D) + ")" : "") << " = " << bytes << " B";
    return o.str();
  };
  e.formulas.push_back(line("weights", Pw, shard_weights && D > 1, r.weight_bytes, e.weights) +
                       (lora ? " (frozen base and adapters)" : ""));
  e.formulas.push_back(line("grads", Tg, shard_grads && D > 1, r.grad_bytes, e.grads));
  e.formulas.push_back(line("master", Ts, shard_state && D > 1, r.master_bytes, e.master));
  e.formulas.push_back(line("moments", Ts, shard_state && D > 1, r.moment_bytes, e.moments));
  if (e.gathered_unit > 0)
    e.formulas.push_back("gathered unit: " + std::to_string(x.largest_unit_params) + " params x " +
                         exact_text(r.weight_bytes + (lora ? 0 : r.grad_bytes)) + " B (unsharded weights" +
                         (lora ? "" : " + grads") + " of the largest unit) = " + std::to_string(e.gathered_unit) +
                         " B");
  else if (shard_weights && D > 1)
    e.formulas.push_back("gathered unit: not given (--unit): 0 B");
  e.excluded = excluded_from_estimate();
  return e;
}

std::string estimate_text(const MemoryEstimate& e) {
  const auto& x = e.input;
  std::ostringstream o;
  o << "# gradcert estimate: model-state lower bound per rank\n";
  o << "recipe " << x.recipe.name << ": " << x.recipe.breakdown() << "\n";
  if (!x.recipe.note.empty()) o << "  note: " << x.recipe.note << "\n";
  const int64_t T = x.trainable < 0 ? x.params : x.trainable;
  o << "params " << sci(static_cast<double>(x.params)) << " (" << x.params << ")";
  if (T < x.params)
    o << ", LoRA: trainable " << sci(static_cast<double>(T)) << " at " << exact_text(x.recipe.per_param())
      << " B/param, frozen base " << sci(static_cast<double>(x.params - T)) << " at "
      << exact_text(x.recipe.bytes.weight_bytes) << " B/param (weights only)";
  o << "\n";
  o << "strategy " << sharding_name(x.strategy) << ", world " << x.world << " (dp " << e.dp << ", tp " << x.tp
    << ", pp " << x.pp << "); this rank's model part: " << e.rank_params << " params, " << e.rank_trainable
    << " trainable\n";
  for (const auto& f : e.formulas) o << "  " << f << "\n";
  o << "model state: " << sci(static_cast<double>(e.model_state())) << " B = " << human_bytes(e.model_state()) << " ("
    << e.model_state() << " B)\n";
  if (e.gathered_unit > 0)
    o << "lower bound with the gathered unit: " << sci(static_cast<double>(e.total()))
      << " B = " << human_bytes(e.total()) << " (" << e.total() << " B)\n";
  o << "excluded (measure them: the peak per phase and length bucket):\n";
  for (const auto& s : e.excluded) o << "  - " << s << "\n";
  return o.str();
}

// NOTE [built-in model state] recipe_for_run says what a dtype and optimizer need; the
// built-in strategies keep exactly that, divided as estimate_memory divides it, except:
//   zero1, zero2: each rank steps a master shard that is a separate copy of its slice of
//     the full weights, also in float64/float32 runs (DeepSpeed's partitioned fp32 groups
//     are a copy even for an fp32 model), so master = the run dtype's bytes.
//   fsdp, bfloat16: the gradient shard accumulates over microsteps in the master's dtype
//     (float32), so grads = 4 B.
// zero3 and fsdp keep the weight shard in the run dtype (the master itself unless
// bfloat16), and free gathered parameters after use; tp, pp, ddp, single hold their
// parameters, gradients and optimizer slots. backends/zero.cpp NOTE [zero model state].
Recipe recipe_for_strategy(Sharding strategy, DType dtype, const OptimizerSpec& optimizer) {
  Recipe r = recipe_for_run(dtype, optimizer);
  const std::string sd = short_dtype(dtype);
  if ((strategy == Sharding::ZeRO1 || strategy == Sharding::ZeRO2) && r.bytes.master_bytes == 0) {
    r.bytes.master_bytes = dtype_bytes(dtype);
    r.master_label = sd + " master shard (a copy of the weights' slice)";
    r.name += "+master-shard";
  }
  if (strategy == Sharding::FSDP && dtype == DType::BFloat16) {
    r.bytes.grad_bytes = 4;
    r.grad_label = "fp32 grad shard";
    r.name += "+fp32-grad-shard";
  }
  r.note = "what the built-in " + sharding_name(strategy) + " keeps for this dtype and optimizer";
  return r;
}

MemoryEstimate estimate_for_run(const Spec& spec, Sharding strategy, int rank) {
  EstimateInput in = tiny_lm_estimate_input(spec, strategy, rank);
  in.recipe = recipe_for_strategy(strategy, spec.dtype, spec.optimizer);
  return estimate_memory(in);
}

MemoryEstimate estimate_for_heaviest_rank(const Spec& spec, Sharding backend) {
  MemoryEstimate best = estimate_for_run(spec, backend, 0);
  for (int r = 1; r < spec.topology.world(); ++r) {
    MemoryEstimate e = estimate_for_run(spec, backend, r);
    if (e.model_state() > best.model_state()) best = std::move(e);
  }
  return best;
}

std::string bucket_name(LengthBucket b) {
  switch (b) {
    case LengthBucket::Short: return "short";
    case LengthBucket::Typical: return "typical";
    case LengthBucket::Long: return "long";
  }
  return "typical";
}

int bucket_length(const Spec& spec, LengthBucket b) {
  std::vector<int> lengths;
  for (int64_t id = 0; id < spec.dataset.size; ++id)
    lengths.push_back(static_cast<int>(make_sample(spec, id).tokens.size()));
  if (lengths.empty()) throw std::invalid_argument("bucket_length: the dataset is empty");
  std::sort(lengths.begin(), lengths.end());
  const auto n = static_cast<double>(lengths.size());
  auto rank = [&](double q) { return std::max<size_t>(1, static_cast<size_t>(std::ceil(q * n))) - 1; };
  switch (b) {
    case LengthBucket::Short: return lengths[rank(0.10)];
    case LengthBucket::Typical: return lengths[rank(0.50)];
    case LengthBucket::Long: return lengths.back();
  }
  return lengths.back();
}

std::vector<int64_t> bucket_ids(const Spec& spec, LengthBucket b, int count) {
  const int target = bucket_length(spec, b);
  std::vector<std::tuple<int, int, int64_t>> keyed;  // (|len - target|, no targets, id)
  for (int64_t id = 0; id < spec.dataset.size; ++id) {
    const Sample s = make_sample(spec, id);
    keyed.emplace_back(std::abs(static_cast<int>(s.tokens.size()) - target), s.valid_targets() == 0 ? 1 : 0, id);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int64_t> ids;
  for (size_t i = 0; i < keyed.size() && static_cast<int>(i) < count; ++i) ids.push_back(std::get<2>(keyed[i]));
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace gradcert
