#include "conformance/core/spec.hpp"

#include "conformance/core/strict_json.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gradcert {

using nlohmann::json;

SpecError::SpecError(const std::string& f, const std::string& what)
    : std::runtime_error("spec field '" + f + "': " + what), field(f) {}

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
  void object(const std::string& key, const std::function<void(Reader&)>& fn) {
    seen_.insert({key, true});
    auto it = j_.find(key);
    if (it == j_.end()) return;
    Reader sub(*it, field(key));
    fn(sub);
    sub.finish();
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
                      {s.dataset.typical_max, "dataset.typical_max"}, {s.dataset.long_max, "dataset.long_max"}})
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
    throw SpecError("device", "expected cpu, cuda or auto, got '" + s.device + "'");
  if (s.optimizer.name != "sgd" && s.optimizer.name != "adamw")
    throw SpecError("optimizer.name", "unknown optimizer '" + s.optimizer.name + "' (expected sgd or adamw)");
  if (!(s.optimizer.lr >= 0)) throw SpecError("optimizer.lr", "must be >= 0 (0: the optimizer's default)");
  if (!(s.optimizer.max_grad_norm >= 0) || !std::isfinite(s.optimizer.max_grad_norm))
    throw SpecError("optimizer.max_grad_norm", "must be a finite number >= 0 (0: no clipping)");
  for (auto [v, f] : {std::pair{s.tolerance.float64, "tolerance.float64"}, {s.tolerance.float32, "tolerance.float32"},
                      {s.tolerance.bfloat16, "tolerance.bfloat16"},
                      {s.tolerance.scale_float64, "tolerance.scale_float64"},
                      {s.tolerance.scale_float32, "tolerance.scale_float32"},
                      {s.tolerance.scale_bfloat16, "tolerance.scale_bfloat16"}})
    if (!(v > 0)) throw SpecError(f, "must be > 0");
  if (!(s.tolerance.floor_factor == 0 || s.tolerance.floor_factor >= 1) || !std::isfinite(s.tolerance.floor_factor))
    throw SpecError("tolerance.floor_factor", "must be 0 (the calibrated tolerances alone) or a finite number >= 1");
  timeout_seconds(s.timeout.collective_s, "timeout.collective_s");
  if (s.pipeline.schedule != "1f1b" && s.pipeline.schedule != "gpipe")
    throw SpecError("pipeline.schedule", "unknown schedule '" + s.pipeline.schedule + "' (expected 1f1b or gpipe)");
  timeout_seconds(s.timeout.run_s, "timeout.run_s");
  if (!(s.memory.budget_bytes >= 0)) throw SpecError("memory.budget_bytes", "must be >= 0 (0: no budget)");
  // resume.at < the plan's number of updates is the harness's check (it knows the plan).
  if (s.resume.at < 0) throw SpecError("resume.at", "must be >= 1 (updates before the save), or 0 for no resume");
  for (auto [v, f] : {std::pair{s.resume.world, "resume.world"}, {s.resume.micro, "resume.micro"},
                      {s.resume.accum, "resume.accum"}})
    if (v < 0) throw SpecError(f, "must be >= 1, or 0 for the first leg's");
  if (s.resume.at == 0 && (!s.resume.backend.empty() || !s.resume.command.empty() || s.resume.world ||
                           s.resume.micro || s.resume.accum))
    throw SpecError(!s.resume.backend.empty() ? "resume.backend" : !s.resume.command.empty() ? "resume.command"
                                                                                            : "resume.world",
                    "needs resume.at (the update count at which the run stops and resumes)");
}

Spec parse_spec(const std::string& text, const std::string& source) {
  json j;
  if (auto p = parse_json_strict(text, j)) {
    if (p->kind == JsonProblem::Kind::Syntax) throw SpecError("(root)", source + " is " + p->what);
    throw SpecError(p->path.empty() ? "(root)" : p->path, p->what);
  }
  Spec s;
  Reader r(j, "");
  r.get("seed", s.seed);
  r.object("model", [&](Reader& m) {
    m.get("vocab", s.model.vocab);
    m.get("d_model", s.model.d_model);
    m.get("heads", s.model.heads);
    m.get("layers", s.model.layers);
    m.get("d_ff", s.model.d_ff);
    m.get("max_len", s.model.max_len);
    m.get("factory", s.model.factory);
  });
  r.object("dataset", [&](Reader& d) {
    d.get("size", s.dataset.size);
    d.get("short_min", s.dataset.short_min);
    d.get("short_max", s.dataset.short_max);
    d.get("typical_min", s.dataset.typical_min);
    d.get("typical_max", s.dataset.typical_max);
    d.get("long_min", s.dataset.long_min);
    d.get("long_max", s.dataset.long_max);
    d.get("short_share", s.dataset.short_share);
    d.get("long_share", s.dataset.long_share);
    d.get("prompt_share", s.dataset.prompt_share);
    d.get("all_prompt_share", s.dataset.all_prompt_share);
    d.get("shuffle", s.dataset.shuffle);
  });
  r.object("batch", [&](Reader& b) {
    b.get("micro", s.batch.micro);
    b.get("accum", s.batch.accum);
  });
  r.object("topology", [&](Reader& t) {
    t.get("dp", s.topology.dp);
    t.get("tp", s.topology.tp);
    t.get("pp", s.topology.pp);
  });
  r.get("updates", s.updates);
  r.get("dtype", s.dtype);
  r.object("optimizer", [&](Reader& o) {
    o.get("name", s.optimizer.name);
    o.get("lr", s.optimizer.lr);
    o.get("momentum", s.optimizer.momentum);
    o.get("beta1", s.optimizer.beta1);
    o.get("beta2", s.optimizer.beta2);
    o.get("eps", s.optimizer.eps);
    o.get("weight_decay", s.optimizer.weight_decay);
    o.get("max_grad_norm", s.optimizer.max_grad_norm);
  });
  r.object("tolerance", [&](Reader& t) {
    t.get("float64", s.tolerance.float64);
    t.get("float32", s.tolerance.float32);
    t.get("bfloat16", s.tolerance.bfloat16);
    t.get("scale_float64", s.tolerance.scale_float64);
    t.get("scale_float32", s.tolerance.scale_float32);
    t.get("scale_bfloat16", s.tolerance.scale_bfloat16);
    t.get("floor_factor", s.tolerance.floor_factor);
  });
  r.object("pipeline", [&](Reader& q) { q.get("schedule", s.pipeline.schedule); });
  r.object("timeout", [&](Reader& t) {
    t.get("collective_s", s.timeout.collective_s);
    t.get("run_s", s.timeout.run_s);
  });
  r.object("memory", [&](Reader& m) { m.get("budget_bytes", s.memory.budget_bytes); });
  r.object("resume", [&](Reader& q) {
    q.get("at", s.resume.at);
    q.get("backend", s.resume.backend);
    q.get("command", s.resume.command);
    q.get("world", s.resume.world);
    q.get("micro", s.resume.micro);
    q.get("accum", s.resume.accum);
  });
  r.get("device", s.device);
  r.get("tf32", s.tf32);
  r.finish();
  validate_spec(s);
  return s;
}

Spec load_spec(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SpecError("(file)", "cannot read spec file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_spec(ss.str(), path);
}

std::string spec_to_json(const Spec& s) {
  json j = {
      {"seed", s.seed},
      {"model", {{"vocab", s.model.vocab}, {"d_model", s.model.d_model}, {"heads", s.model.heads},
                 {"layers", s.model.layers}, {"d_ff", s.model.d_ff}, {"max_len", s.model.max_len},
                 {"factory", s.model.factory}}},
      {"dataset", {{"size", s.dataset.size}, {"short_min", s.dataset.short_min}, {"short_max", s.dataset.short_max},
                   {"typical_min", s.dataset.typical_min}, {"typical_max", s.dataset.typical_max},
                   {"long_min", s.dataset.long_min}, {"long_max", s.dataset.long_max},
                   {"short_share", s.dataset.short_share}, {"long_share", s.dataset.long_share},
                   {"prompt_share", s.dataset.prompt_share}, {"all_prompt_share", s.dataset.all_prompt_share},
                   {"shuffle", s.dataset.shuffle}}},
      {"batch", {{"micro", s.batch.micro}, {"accum", s.batch.accum}}},
      {"topology", {{"dp", s.topology.dp}, {"tp", s.topology.tp}, {"pp", s.topology.pp}}},
      {"updates", s.updates},
      {"dtype", dtype_name(s.dtype)},
      {"optimizer", {{"name", s.optimizer.name}, {"lr", s.optimizer.learning_rate()}, {"momentum", s.optimizer.momentum},
                     {"beta1", s.optimizer.beta1}, {"beta2", s.optimizer.beta2}, {"eps", s.optimizer.eps},
                     {"weight_decay", s.optimizer.weight_decay}, {"max_grad_norm", s.optimizer.max_grad_norm}}},
      {"tolerance", {{"float64", s.tolerance.float64}, {"float32", s.tolerance.float32},
                     {"bfloat16", s.tolerance.bfloat16}, {"scale_float64", s.tolerance.scale_float64},
                     {"scale_float32", s.tolerance.scale_float32}, {"scale_bfloat16", s.tolerance.scale_bfloat16},
                     {"floor_factor", s.tolerance.floor_factor}}},
      {"timeout", {{"collective_s", s.timeout.collective_s}, {"run_s", s.timeout.run_s}}},
      {"pipeline", {{"schedule", s.pipeline.schedule}}},
      {"memory", {{"budget_bytes", s.memory.budget_bytes}}},
  };
  // Only a resumed run says so: every other spec (and plan.json) stays as it was.
  if (s.resume.at > 0)
    j["resume"] = {{"at", s.resume.at}, {"backend", s.resume.backend}, {"world", s.resume.world},
                   {"micro", s.resume.micro}, {"accum", s.resume.accum}};
  if (!s.resume.command.empty()) j["resume"]["command"] = s.resume.command;  // external stacks only
  if (s.device != "cpu") j["device"] = s.device;  // likewise: a CPU spec's JSON is as it was
  if (s.tf32) j["tf32"] = true;
  return j.dump(2);
}

}  // namespace gradcert
