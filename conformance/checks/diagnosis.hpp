// The diagnosis: which objective a stack's gradient matches, formed from the reference's
// per-(DP rank, microstep) piece gradients as linear combinations (torch-free).
#pragma once
#include <string>
#include <vector>

#include "conformance/core/result.hpp"
#include "conformance/protocol/reference_artifacts.hpp"

namespace gradcert {

/// One candidate objective: the coefficient of each piece's gradient grad S_{r,a}.
struct ObjectiveCandidate {
  std::string id;           ///< "global-mean", "local-mean", ...
  std::string description;  ///< what a stack computing it does
  /// c_{r,a} for piece `p` of a window (`pieces` the window's), D data-parallel ranks, A microsteps.
  double (*coefficient)(const PieceMeta& p, const UpdatePieces& window, int dp, int accum);
};

/// The candidates, the correct one (global-mean) first.
const std::vector<ObjectiveCandidate>& objective_candidates();

/// Forms every candidate's gradient from `pieces` and compares the stack's gradients `run`
/// with it: per candidate, the worst update's ||g - g_candidate|| / ||g_global-mean|| over all
/// tensors, over the updates where the stack started from the reference's parameters (update
/// 0, and each update whose previous parameters agree with the reference's within
/// `tolerance`): the pieces are gradients at the reference's parameters, so only there is a
/// candidate's gradient the one the stack would compute. The best and the runner-up are
/// named. `ran` is false (with `note` saying why) when there are no pieces.
/// `teacher_forced`: the pieces of update u are at the stack's own parameters after u-1
/// (reference.py --pieces-at), so every update is judged.
Diagnosis diagnose(const std::vector<UpdatePieces>& pieces, const std::vector<ReferenceUpdate>& reference,
                   const std::vector<BackendUpdate>& run, int dp, int accum, double tolerance,
                   bool teacher_forced = false);

}  // namespace gradcert
