// The run specification: what model, data, batch, topology and tolerances a run uses.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "conformance/core/tensors.hpp"

namespace gradcert {

/// A spec field that is unknown, ill-typed or out of range. `field` is its JSON path
/// ("batch.micro"), and the message names it.
struct SpecError : std::runtime_error {
  SpecError(const std::string& field, const std::string& what);
  std::string field;
};

/// The tiny causal LM (GPT-style: embeddings, pre-LN blocks with attention and MLP, LM head).
struct ModelSpec {
  int vocab = 32;
  int d_model = 16;
  int heads = 2;
  int layers = 2;
  int d_ff = 32;
  int max_len = 24;
  /// The user's own model: "FILE.py:FUNC" or "module:FUNC", FUNC(vocab_size, max_len) -> a
  /// torch.nn.Module causal LM (backends/PROTOCOL.md). "": the built-in tiny LM above.
  std::string factory;
};

/// The seeded synthetic dataset. Lengths follow a three-bucket distribution.
struct DatasetSpec {
  int size = 26;  ///< examples in one epoch
  int short_min = 3, short_max = 6;
  int typical_min = 8, typical_max = 14;
  int long_min = 18, long_max = 24;
  double short_share = 0.2;       ///< probability of a short example
  double long_share = 0.15;       ///< probability of a long example (the rest are typical)
  double prompt_share = 0.3;      ///< mean share of an example's tokens that are prompt (masked)
  double all_prompt_share = 0.1;  ///< probability that an example is all prompt (0 targets)
  bool shuffle = true;            ///< a seeded permutation per epoch
};

/// Examples per replica per microstep and accumulation microsteps per update.
struct BatchSpec {
  int micro = 2;  ///< B_micro
  int accum = 3;  ///< A
};

/// The process grid. world = dp x tp x pp.
/// The most ranks one run starts (NOTE [spec limits]): --world and D x TP x PP.
constexpr int kMaxWorld = 4096;

struct TopologySpec {
  int dp = 2, tp = 1, pp = 1;
  int world() const { return dp * tp * pp; }
};

/// The optimizer the reference and every backend apply (elementwise, so shardable).
struct OptimizerSpec {
  std::string name = "sgd";                       ///< "sgd" | "adamw"
  double lr = 0;                                  ///< 0: the optimizer's default (sgd 0.1, adamw 1e-3)
  double momentum = 0.0;                          ///< sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< adamw
  double weight_decay = 0.0;
  double max_grad_norm = 0.0;  ///< clip the full reduced gradient to this global L2 norm before the step (0: off)

  /// lr, or the optimizer's default when lr is 0.
  double learning_rate() const { return lr > 0 ? lr : (name == "adamw" ? 1e-3 : 0.1); }
};

/// Per-dtype relative tolerances for parity checks. See NOTE [tolerances] in spec.cpp.
struct ToleranceSpec {
  double float64 = 1e-10;
  double float32 = 2e-5;
  double bfloat16 = 1.5e-1;
  /// grad.scale: |<g, g_ref> / <g_ref, g_ref> - 1| per update (NOTE [scale tolerances] in spec.cpp).
  double scale_float64 = 1e-10;
  double scale_float32 = 2e-6;
  double scale_bfloat16 = 4e-2;
  /// Each loss, gradient and parameter check is held to max(the tolerance above, floor_factor x
  /// the run's own noise floor) (NOTE [noise floor] in conformance/model/reference.cpp); 0: the
  /// tolerances above alone (no floor is applied).
  double floor_factor = 10;
};

/// How the pp backend schedules the window's microbatches.
struct PipelineSpec {
  std::string schedule = "1f1b";  ///< "1f1b" | "gpipe"
};

/// The range a timeout must lie in, in seconds (1 ms .. about 11.6 days).
constexpr double kMinTimeoutSeconds = 1e-3, kMaxTimeoutSeconds = 1e6;

/// Limits that keep a broken run from hanging; each in [kMinTimeoutSeconds, kMaxTimeoutSeconds].
struct TimeoutSpec {
  double collective_s = 30;  ///< each collective (Gloo timeout)
  double run_s = 300;        ///< the whole rank group
};

/// The memory budget memory.budget holds every phase peak to (per rank, phase and bucket).
struct MemorySpec {
  double budget_bytes = 0;  ///< 0: no budget (memory.budget is skipped)
};

/// A run that stops and resumes (NOTE [resume] in conformance/run/harness.cpp): the first leg
/// trains `at` updates and saves a checkpoint; every process stops; a second leg starts a new
/// process group (of `backend`, "" = the same strategy), loads it and trains to the end.
struct ResumeSpec {
  int at = 0;           ///< updates before the save; 0: no resume
  std::string backend;  ///< the second leg's strategy ("" = the first leg's)
  /// --backend external: the second leg's launch command ("" = the first leg's), e.g. DDP -> FSDP2.
  std::string command;
  /// The second leg's world (0 = the first's; TP and PP stay) and batch split, which must
  /// keep B_update (0 = derived: the micro batch kept, else the accumulation steps).
  int world = 0, micro = 0, accum = 0;
};

/// Everything a run is a function of.
struct Spec {
  uint64_t seed = 1234;
  ModelSpec model;
  DatasetSpec dataset;
  BatchSpec batch;
  TopologySpec topology;
  int updates = 0;  ///< optimizer updates (windows); may span epochs; 0 = one epoch
  DType dtype = DType::Float64;
  OptimizerSpec optimizer;
  ToleranceSpec tolerance;
  TimeoutSpec timeout;
  PipelineSpec pipeline;
  MemorySpec memory;
  ResumeSpec resume;
  /// Where the ranks compute: "cpu" | "cuda" | "auto" (NOTE [device]: "auto" and "cuda" are
  /// resolved, and refused where CUDA is unavailable, before any rank starts).
  std::string device = "cpu";
  /// TF32 matmul / cuDNN on CUDA (off: float32 stays float32; the report says which).
  bool tf32 = false;

  /// The relative tolerance for this spec's dtype.
  double parity_tolerance() const;
  /// The grad.scale tolerance for this spec's dtype.
  double scale_tolerance() const;
};

/// Parses a spec from JSON text. Missing fields take defaults; an unknown field, a wrong
/// type or an out-of-range value throws SpecError naming the field. `source` names the
/// file in messages.
Spec parse_spec(const std::string& json_text, const std::string& source = "spec");
/// Reads and parses a spec file (SpecError naming the file if it cannot be read).
Spec load_spec(const std::string& path);
/// The spec as JSON (every field, defaults included).
std::string spec_to_json(const Spec& spec);
/// Throws SpecError for inconsistent values (e.g. d_model % heads != 0).
void validate_spec(const Spec& spec);

}  // namespace gradcert
