// The reference runner's artifacts read back (backends/python/gradcert/ref/reference.py writes
// them in the protocol's format): per update the loss, N, the gradient and the parameters after
// the step, and per (DP rank, microstep) piece the gradient of its loss sum.
#pragma once
#include <string>
#include <vector>

#include "conformance/core/plan.hpp"
#include "conformance/protocol/artifacts.hpp"

namespace gradcert {

/// One (DP rank, microstep) piece of a window.
struct PieceMeta {
  int dp_rank = 0, micro = 0;
  double loss_sum = 0;            ///< S_{r,a}
  int64_t valid_targets = 0;      ///< n_{r,a}
  int64_t rows_with_targets = 0;  ///< examples with at least one target
};

/// The pieces of one update: their metadata and gradients (names "r<r>.a<a>.<param>").
struct UpdatePieces {
  int update = 0;
  bool partial = false;
  int64_t valid_targets = 0;  ///< N
  std::vector<PieceMeta> meta;
  TensorMap grads;  ///< by "r<r>.a<a>.<param>"
};

/// What the reference runner wrote into `dir`.
struct ReferenceRun {
  std::vector<ReferenceUpdate> updates;
  /// Teacher-forced (NOTE [teacher forcing]): per update at the stack's parameters after the
  /// previous one; empty when the runner computed none (no --pieces-at).
  std::vector<ReferenceUpdate> forced;
  std::vector<UpdatePieces> pieces;  ///< empty when the runner wrote none
  bool float64_throughout = true;    ///< the manifest's precision record
  std::string precision_note;        ///< what ran in lower precision, when not
  /// The lowest floating dtype the probe saw inside the model ("float32", "bfloat16", "float16"; "" when float64 throughout).
  std::string lowest_inner_dtype;
  /// The pieces are at the stack's parameters after the previous update (reference.py
  /// --pieces-at; NOTE [pieces at the stack's parameters]), not at the reference's own.
  bool pieces_at_stack = false;
};

/// Reads <dir>/manifest.json and the tensors it names strictly (names and shapes from
/// `expected`, float64). Throws ArtifactError naming the file.
ReferenceRun read_reference_run(const std::string& dir, const Plan& plan, const TensorMap& expected);

}  // namespace gradcert
