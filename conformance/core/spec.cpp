#include "conformance/core/spec.hpp"

#include "conformance/core/format.hpp"
#include "conformance/core/strict_json.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gradcert {

using nlohmann::json;

SpecError::SpecError(const std::string& f, const std::string& what)
    : std::runtime_error("spec field " + quoted_excerpt(f) + ": " + what), field(f) {}

// NOTE [tolerances] Parity is the relative L2 error of each tensor against the float64
// reference (and of the loss). Measured on the built-in model over seeds 1-8, single and
// ddp (world 2), SGD lr 0.1 and AdamW lr 1e-3, every update of one epoch:
//   float64  worst 2.4e-15 (summation order only)      -> 1e-10, five orders of margin;
//   float32  worst 1.8e-6                               -> 2e-5, ~11x margin;
//   bfloat16 worst 7.1e-2 (bf16 compute, fp32 master)   -> 1.5e-1, ~2x margin.
// Any scaling bug moves the figure by |factor - 1| >= 1/3 for D <= 3, A <= 3, so float64
// and float32 catch every factor error; bfloat16 catches factor errors above ~15% only,
// and the report's tolerance column says so. These are minimums: a run's checks are held to
// max(this, tolerance.floor_factor x the run's own noise floor) (NOTE [noise floor] in
// conformance/model/reference.cpp), which grows with the model where rounding does.
double Spec::parity_tolerance() const {
  switch (dtype) {
    case DType::Float64: return tolerance.float64;
    case DType::Float32: return tolerance.float32;
    case DType::BFloat16: return tolerance.bfloat16;
  }
  return tolerance.float64;
}

// NOTE [scale tolerances] grad.scale projects the stack's gradient on the reference's:
// s = <g, g_ref> / <g_ref, g_ref> over every tensor of an update. Rounding noise is mostly
// orthogonal to g_ref, so s stays near 1 far below the relative-L2 noise, while a
// normalisation bug is a pure scale. Measured on 40 correct built-in runs per dtype (seeds
// 1-4; single, ddp D=2, fsdp D=2, tp TP=2, zero3 D=3; SGD and AdamW; default spec):
//   float32: worst |s - 1| 6.1e-7 (grad.parity worst 2.0e-5)  -> tolerance 2e-6 (x3.3)
//   bfloat16: worst |s - 1| 1.9e-2 (grad.parity worst 6.0e-2) -> tolerance 4e-2 (x2.1)
//   float64: round-off (~1e-16)                                 -> tolerance 1e-10, as grad.parity
// So bfloat16 runs catch uniform scale errors above ~4% (grad.parity's 1.5e-1 only above ~15%)
// and float32 runs above ~2e-6. The free-running trajectories of later updates carry most of
// the bfloat16 noise; update 0 (identical weights on both sides) is far cleaner.
double Spec::scale_tolerance() const {
  switch (dtype) {
    case DType::Float64: return tolerance.scale_float64;
    case DType::Float32: return tolerance.scale_float32;
    case DType::BFloat16: return tolerance.scale_bfloat16;
  }
  return tolerance.scale_float64;
}

namespace {

// A strict reader over one JSON object: every key must be consumed by a field reader.
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) throw SpecError(path_.empty() ? "(root)" : path_, "expected an object");
  }
  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  template <class T>
  void get(const std::string& key, T& out) {
    seen_.insert({key, true});
    auto it = j_.find(key);
    if (it == j_.end()) return;
    read(*it, field(key), out);
  }
  /// The value at `key` for a nested reader (nullptr when absent; marked as seen either way).
  const json* section(const std::string& key) {
    seen_.insert({key, true});
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) throw SpecError(field(it.key()), "unknown field");
  }

 private:
  static void read(const json& v, const std::string& f, int& out) {
    if (!v.is_number_integer()) throw SpecError(f, "expected an integer, got " + json_excerpt(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT32_MAX)) throw SpecError(f, "integer out of range");
    auto x = v.get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) throw SpecError(f, "integer out of range");
    out = static_cast<int>(x);
  }
  static void read(const json& v, const std::string& f, uint64_t& out) {
    if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
      throw SpecError(f, "expected a non-negative integer, got " + json_excerpt(v));
    out = v.get<uint64_t>();
  }
  static void read(const json& v, const std::string& f, double& out) {
    if (!v.is_number()) throw SpecError(f, "expected a number, got " + json_excerpt(v));
    out = v.get<double>();
  }
  static void read(const json& v, const std::string& f, bool& out) {
    if (!v.is_boolean()) throw SpecError(f, "expected true or false, got " + json_excerpt(v));
    out = v.get<bool>();
  }
  static void read(const json& v, const std::string& f, std::string& out) {
    if (!v.is_string()) throw SpecError(f, "expected a string, got " + json_excerpt(v));
    out = v.get<std::string>();
  }
  static void read(const json& v, const std::string& f, DType& out) {
    std::string s;
    read(v, f, s);
    try {
      out = parse_dtype(s);
    } catch (const std::invalid_argument& e) {
      throw SpecError(f, e.what());
    }
  }

  const json& j_;
  std::string path_;
  std::map<std::string, bool> seen_;
};

void positive(int v, const std::string& f) {
  if (v < 1) throw SpecError(f, "must be >= 1, got " + std::to_string(v));
}
void share(double v, const std::string& f) {
  if (!(v >= 0.0 && v <= 1.0)) throw SpecError(f, "must be in [0, 1], got " + std::to_string(v));
}
// Timeouts become std::chrono milliseconds added to a steady_clock nanosecond time point:
// beyond ~9.2e9 s that overflows (an instant timeout, or a negative Gloo timeout), and below
// 1 ms it truncates to 0 (no timeout at all for Gloo). 1e6 s is about 11.6 days.
void timeout_seconds(double v, const std::string& f) {
  if (!(v >= kMinTimeoutSeconds && v <= kMaxTimeoutSeconds)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", v);
    throw SpecError(f, std::string("must be in [0.001, 1e6] seconds, got ") + got);
  }
}
void range(int lo, int hi, const std::string& f) {
  if (lo < 2) throw SpecError(f + "_min", "must be >= 2 (an example needs a next token), got " + std::to_string(lo));
  if (hi < lo) throw SpecError(f + "_max", "must be >= " + f + "_min");
}

// NOTE [optimizer ranges] The ranges torch.optim itself enforces (SGD: lr, momentum and
// weight_decay >= 0; Adam / AdamW: also eps >= 0 and betas in [0, 1)), every value finite: a
// spec outside them names the field instead of running a rule no stack would run.
void optimizer_ranges(const OptimizerSpec& o) {
  auto at_least_zero = [](double v, const char* f, const char* what) {
    if (!(v >= 0) || !std::isfinite(v))
      throw SpecError(f, std::string("must be a finite number >= 0") + what + ", got " + g3_text(v));
  };
  at_least_zero(o.lr, "optimizer.lr", " (0: the optimizer's default)");
  at_least_zero(o.momentum, "optimizer.momentum", " (torch.optim.SGD's range)");
  at_least_zero(o.weight_decay, "optimizer.weight_decay", " (torch.optim's range)");
  at_least_zero(o.eps, "optimizer.eps", " (torch.optim.AdamW's range)");
  for (auto [v, f] : {std::pair{o.beta1, "optimizer.beta1"}, {o.beta2, "optimizer.beta2"}})
    if (!(v >= 0 && v < 1)) throw SpecError(f, "must be in [0, 1) (torch.optim.AdamW's range), got " + g3_text(v));
}

// NOTE [spec limits] Sizes are bounded before anything is allocated, each error naming the field,
// its value, the limit and the memory it would take: the plan holds every example of the dataset
// and every update's D x A microbatch slots, and gradcert starts every rank itself. (The built-in
// model's size is held to this machine's memory where the run is planned: NOTE [oversized specs].)
constexpr int64_t kMaxDatasetSize = 1'000'000, kMaxUpdates = 1'000'000, kMaxBatch = 1'000'000;
constexpr int64_t kMaxSlots = 10'000'000;
constexpr int64_t kSlotBytes = 64;

void at_most(double v, int64_t limit, const std::string& f, const std::string& what, double bytes_each) {
  if (v <= static_cast<double>(limit)) return;
  throw SpecError(f, sci(v) + " exceeds the limit " + sci(static_cast<double>(limit)) + " (" + what +
                         (bytes_each > 0 ? ": it would need about " + human_bytes(v * bytes_each) : std::string()) +
                         ")");
}

void spec_limits(const Spec& s) {
  const double example_bytes = 96 + 16.0 * std::max(s.model.max_len, 1);
  at_most(s.dataset.size, kMaxDatasetSize, "dataset.size", "the plan holds every example", example_bytes);
  at_most(s.updates, kMaxUpdates, "updates", "the plan holds every window", 0);
  at_most(s.batch.micro, kMaxBatch, "batch.micro", "examples in one forward", example_bytes);
  at_most(s.batch.accum, kMaxBatch, "batch.accum", "microsteps in one window", kSlotBytes);
  const TopologySpec& t = s.topology;
  for (auto [v, f] : {std::pair{t.dp, "topology.dp"}, {t.tp, "topology.tp"}, {t.pp, "topology.pp"}})
    at_most(v, kMaxWorld, f, "gradcert starts every rank as a process", 0);
  at_most(double(t.dp) * t.tp * t.pp, kMaxWorld, "topology.dp", "D x TP x PP ranks, each a process", 0);
  const double batch = double(s.batch.micro) * s.batch.accum * t.dp;
  at_most(batch, kMaxBatch, "batch.micro", "B_update = B_micro x A x D", example_bytes);
  const double windows = s.updates > 0 ? s.updates : std::ceil(std::max(s.dataset.size, 1) / batch);
  at_most(windows * t.dp * s.batch.accum, kMaxSlots, s.updates > 0 ? "updates" : "batch.accum",
          "the plan's microbatch slots: windows x D x A", kSlotBytes);
}

}  // namespace

void validate_spec(const Spec& s) {
  positive(s.model.vocab, "model.vocab");
  if (s.model.vocab < 3) throw SpecError("model.vocab", "must be >= 3 (token 0 is padding)");
  positive(s.model.d_model, "model.d_model");
  positive(s.model.heads, "model.heads");
  if (s.model.d_model % s.model.heads != 0)
    throw SpecError("model.heads", "must divide model.d_model (" + std::to_string(s.model.d_model) + ")");
  positive(s.model.layers, "model.layers");
  positive(s.model.d_ff, "model.d_ff");
  positive(s.model.max_len, "model.max_len");
  positive(s.dataset.size, "dataset.size");
  range(s.dataset.short_min, s.dataset.short_max, "dataset.short");
  range(s.dataset.typical_min, s.dataset.typical_max, "dataset.typical");
  range(s.dataset.long_min, s.dataset.long_max, "dataset.long");
  for (auto [v, f] : {std::pair{s.dataset.short_max, "dataset.short_max"},
                      {s.dataset.typical_max, "dataset.typical_max"},
                      {s.dataset.long_max, "dataset.long_max"}})
    if (v > s.model.max_len) throw SpecError(f, "exceeds model.max_len (" + std::to_string(s.model.max_len) + ")");
  share(s.dataset.short_share, "dataset.short_share");
  share(s.dataset.long_share, "dataset.long_share");
  if (s.dataset.short_share + s.dataset.long_share > 1.0)
    throw SpecError("dataset.long_share", "short_share + long_share must be <= 1");
  share(s.dataset.prompt_share, "dataset.prompt_share");
  share(s.dataset.all_prompt_share, "dataset.all_prompt_share");
  positive(s.batch.micro, "batch.micro");
  positive(s.batch.accum, "batch.accum");
  positive(s.topology.dp, "topology.dp");
  positive(s.topology.tp, "topology.tp");
  positive(s.topology.pp, "topology.pp");
  if (s.updates < 0) throw SpecError("updates", "must be >= 0 (0 = one epoch)");
  if (s.device != "cpu" && s.device != "cuda" && s.device != "auto")
    throw SpecError("device", "expected cpu, cuda or auto, got " + quoted_excerpt(s.device));
  if (s.optimizer.name != "sgd" && s.optimizer.name != "adamw")
    throw SpecError("optimizer.name",
                    "unknown optimizer " + quoted_excerpt(s.optimizer.name) + " (expected sgd or adamw)");
  optimizer_ranges(s.optimizer);
  if (!(s.optimizer.max_grad_norm >= 0) || !std::isfinite(s.optimizer.max_grad_norm))
    throw SpecError("optimizer.max_grad_norm", "must be a finite number >= 0 (0: no clipping)");
  for (auto [v, f] : {std::pair{s.tolerance.float64, "tolerance.float64"},
                      {s.tolerance.float32, "tolerance.float32"},
                      {s.tolerance.bfloat16, "tolerance.bfloat16"},
                      {s.tolerance.scale_float64, "tolerance.scale_float64"},
                      {s.tolerance.scale_float32, "tolerance.scale_float32"},
                      {s.tolerance.scale_bfloat16, "tolerance.scale_bfloat16"}})
    if (!(v > 0)) throw SpecError(f, "must be > 0");
  if (!(s.tolerance.floor_factor == 0 || s.tolerance.floor_factor >= 1) || !std::isfinite(s.tolerance.floor_factor))
    throw SpecError("tolerance.floor_factor", "must be 0 (the calibrated tolerances alone) or a finite number >= 1");
  timeout_seconds(s.timeout.collective_s, "timeout.collective_s");
  if (s.pipeline.schedule != "1f1b" && s.pipeline.schedule != "gpipe")
    throw SpecError("pipeline.schedule",
                    "unknown schedule " + quoted_excerpt(s.pipeline.schedule) + " (expected 1f1b or gpipe)");
  timeout_seconds(s.timeout.run_s, "timeout.run_s");
  if (!(s.memory.budget_bytes >= 0)) throw SpecError("memory.budget_bytes", "must be >= 0 (0: no budget)");
  // resume.at < the plan's number of updates is the harness's check (it knows the plan).
  if (s.resume.at < 0) throw SpecError("resume.at", "must be >= 1 (updates before the save), or 0 for no resume");
  for (auto [v, f] :
       {std::pair{s.resume.world, "resume.world"}, {s.resume.micro, "resume.micro"}, {s.resume.accum, "resume.accum"}})
    if (v < 0) throw SpecError(f, "must be >= 1, or 0 for the first leg's");
  if (s.resume.at == 0 &&
      (!s.resume.backend.empty() || !s.resume.command.empty() || s.resume.world || s.resume.micro || s.resume.accum))
    throw SpecError(!s.resume.backend.empty()   ? "resume.backend"
                    : !s.resume.command.empty() ? "resume.command"
                                                : "resume.world",
                    "needs resume.at (the update count at which the run stops and resumes)");
  spec_limits(s);  // after the checks above: every count is >= 1 here
}

// NOTE [spec fields] The one list of the spec's fields, in the JSON's order: parse_spec reads
// and spec_to_json writes each field through it (a new field is one line here, plus its
// validation in validate_spec). `f(section, key, member)`; section "" is the top level.
template <class S, class F>
void spec_fields(S& s, F&& f) {
  f("", "seed", s.seed);
  f("model", "vocab", s.model.vocab);
  f("model", "d_model", s.model.d_model);
  f("model", "heads", s.model.heads);
  f("model", "layers", s.model.layers);
  f("model", "d_ff", s.model.d_ff);
  f("model", "max_len", s.model.max_len);
  f("model", "factory", s.model.factory);
  f("dataset", "size", s.dataset.size);
  f("dataset", "short_min", s.dataset.short_min);
  f("dataset", "short_max", s.dataset.short_max);
  f("dataset", "typical_min", s.dataset.typical_min);
  f("dataset", "typical_max", s.dataset.typical_max);
  f("dataset", "long_min", s.dataset.long_min);
  f("dataset", "long_max", s.dataset.long_max);
  f("dataset", "short_share", s.dataset.short_share);
  f("dataset", "long_share", s.dataset.long_share);
  f("dataset", "prompt_share", s.dataset.prompt_share);
  f("dataset", "all_prompt_share", s.dataset.all_prompt_share);
  f("dataset", "shuffle", s.dataset.shuffle);
  f("batch", "micro", s.batch.micro);
  f("batch", "accum", s.batch.accum);
  f("topology", "dp", s.topology.dp);
  f("topology", "tp", s.topology.tp);
  f("topology", "pp", s.topology.pp);
  f("", "updates", s.updates);
  f("", "dtype", s.dtype);
  f("optimizer", "name", s.optimizer.name);
  f("optimizer", "lr", s.optimizer.lr);
  f("optimizer", "momentum", s.optimizer.momentum);
  f("optimizer", "beta1", s.optimizer.beta1);
  f("optimizer", "beta2", s.optimizer.beta2);
  f("optimizer", "eps", s.optimizer.eps);
  f("optimizer", "weight_decay", s.optimizer.weight_decay);
  f("optimizer", "max_grad_norm", s.optimizer.max_grad_norm);
  f("tolerance", "float64", s.tolerance.float64);
  f("tolerance", "float32", s.tolerance.float32);
  f("tolerance", "bfloat16", s.tolerance.bfloat16);
  f("tolerance", "scale_float64", s.tolerance.scale_float64);
  f("tolerance", "scale_float32", s.tolerance.scale_float32);
  f("tolerance", "scale_bfloat16", s.tolerance.scale_bfloat16);
  f("tolerance", "floor_factor", s.tolerance.floor_factor);
  f("pipeline", "schedule", s.pipeline.schedule);
  f("timeout", "collective_s", s.timeout.collective_s);
  f("timeout", "run_s", s.timeout.run_s);
  f("memory", "budget_bytes", s.memory.budget_bytes);
  f("resume", "at", s.resume.at);
  f("resume", "backend", s.resume.backend);
  f("resume", "command", s.resume.command);
  f("resume", "world", s.resume.world);
  f("resume", "micro", s.resume.micro);
  f("resume", "accum", s.resume.accum);
  f("", "device", s.device);
  f("", "tf32", s.tf32);
}

template <class T>
json to_json_value(const T& v) {
  return v;
}
json to_json_value(const DType& d) { return dtype_name(d); }

Spec parse_spec(const std::string& text, const std::string& source) {
  json j;
  if (auto p = parse_json_strict(text, j)) {
    if (p->kind == JsonProblem::Kind::Syntax) throw SpecError("(root)", source + " is " + p->what);
    throw SpecError(p->path.empty() ? "(root)" : p->path, p->what);
  }
  Spec s;
  Reader r(j, "");
  // Fields in the table's order; a section's unknown keys are reported when the table leaves it,
  // as a nested reader did.
  std::string section;
  std::optional<Reader> sub;
  auto leave = [&] {
    if (sub) sub->finish();
    sub.reset();
  };
  spec_fields(s, [&](const char* sec, const char* key, auto& member) {
    if (*sec == '\0') {
      leave();
      section.clear();
      r.get(key, member);
      return;
    }
    if (section != sec) {
      leave();
      section = sec;
      if (const json* v = r.section(sec)) sub.emplace(*v, r.field(sec));
    }
    if (sub) sub->get(key, member);
  });
  leave();
  r.finish();
  validate_spec(s);
  return s;
}

Spec load_spec(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SpecError("(file)", "cannot read spec file " + quoted_excerpt(path, 200));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_spec(ss.str(), path);
}

std::string spec_to_json(const Spec& s) {
  json j = json::object();
  spec_fields(s, [&](const char* sec, const char* key, const auto& member) {
    const std::string section = sec, k = key;
    // Only a resumed run says so (every other spec, and plan.json, stays as it was); likewise a
    // device other than the CPU and TF32 on; resume.command only for an external stack.
    if (section == "resume" && (k == "command" ? s.resume.command.empty() : s.resume.at <= 0)) return;
    if (k == "device" && section.empty() && s.device == "cpu") return;
    if (k == "tf32" && section.empty() && !s.tf32) return;
    json& at = section.empty() ? j[k] : j[section][k];
    if (section == "optimizer" && k == "lr")
      at = s.optimizer.learning_rate();  // the rate used: lr 0 means the optimizer's default
    else
      at = to_json_value(member);
  });
  return j.dump(2);
}

}  // namespace gradcert
