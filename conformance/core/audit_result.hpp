// The result model of a migration audit: two sides, their per-update and per-tensor
// differences, the migration notes and the verdict. Writers in reports/ render it.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "conformance/core/result.hpp"

namespace gradcert {

/// One side of an audit, resolved from the name the user gave.
///   built-in:  single ddp zero1 zero2 zero3 fsdp tp pp (`gradcert backends`)
///   adapters:  fsdp1 fsdp2 (= torch-fsdp1 torch-fsdp2), torch-ddp: the PyTorch adapters of
///              backends/python/ over the file protocol (command from command.sh)
///   any stack: external:<command>
/// A planted bug: "<name>+inject=<mutant>" or AuditRequest::{before,after}_inject.
/// NOTE: the built-in `fsdp` (gradcert's own C++ FSDP on Gloo) is not PyTorch FSDP1/FSDP2.
struct AuditSide {
  std::string name;     ///< as given
  std::string label;    ///< "torch-fsdp1", "ddp", "external", ...
  std::string backend;  ///< a built-in name or kExternalBackend
  std::string command;  ///< external: the launch command
  std::string inject;   ///< built-in: a mutant; adapter: its --mutant flag
};

/// One tensor in one update: after vs before (before is the baseline).
struct AuditTensorDiff {
  int update = 0;
  std::string name;
  double grad_rel = 0, grad_max_abs = 0;
  double param_rel = 0, param_max_abs = 0;
};

/// One update side by side.
struct AuditUpdate {
  int update = 0;
  int64_t batch_before = 0, batch_after = 0;  ///< examples consumed (B_update or the partial window)
  int64_t n_before = 0, n_after = 0;          ///< the N each stack used
  double loss_before = 0, loss_after = 0;
  double step_before = 0, step_after = 0;  ///< seconds
};

/// What one side's manifest says beyond the protocol's required keys.
struct AuditSideFacts {
  std::string manifest_backend;                 ///< manifest "backend"
  std::map<std::string, std::string> versions;  ///< manifest "versions" (adapters)
  std::string notes;                            ///< manifest "notes" (adapters)
  double step_seconds_median = 0;
  std::optional<double> peak_memory_bytes;    ///< manifest "peak_memory_bytes" (external stacks), or the
                                              ///< worst phase peak of a built-in run (RunReport::memory)
  std::optional<double> model_state_bytes;    ///< built-in: measured model state (RunReport::memory);
                                              ///< external: manifest "model_state_bytes" (worst rank)
  std::string peak_memory_kind;               ///< what the peak measures ("tracked tensor peak", or the
                                              ///< manifest's "peak_memory_kind")
  std::optional<double> target_tokens_per_s;  ///< built-in: RunReport::throughput
};

/// Something that commonly changes in such a migration, and whether this run exercises it.
struct MigrationNote {
  std::string id;  ///< "reduce-dtype", "divide-factor", "grad-sync", "state-dict", "flat-params", ...
  std::string topic;
  std::string before;  ///< how the before side does it
  std::string after;   ///< how the after side does it
  bool applies = false;
  std::string why;  ///< why it is / is not exercised by this run (and where it would show)
};

struct AuditReport {
  Environment environment;
  std::string spec_json;
  AuditSide before_side, after_side;
  RunReport before, after;
  AuditSideFacts before_facts, after_facts;
  double tolerance = 0;  ///< the spec's parity tolerance (per dtype)
  std::vector<AuditUpdate> updates;
  std::vector<AuditTensorDiff> diffs;  ///< per update, per tensor
  std::vector<MigrationNote> notes;
  std::string memory;                    ///< memory side by side, or why it is not shown
  std::vector<std::string> differences;  ///< empty: the migration preserves training semantics
  bool compared = false;                 ///< both runs produced artifacts and were compared
  /// gradcert was interrupted by this signal (SIGINT / SIGTERM; NOTE [interrupt]): the side it
  /// was running was stopped, a side not yet started was not run, nothing was compared. 0 otherwise.
  int interrupted = 0;

  /// Both sides passed every check and agree with each other within the tolerance.
  bool preserved() const { return differences.empty() && compared; }
  /// A run failed (error) on either side.
  bool run_failed() const { return !before.error.empty() || !after.error.empty(); }
  /// "the migration preserves training semantics" or "N difference(s)".
  std::string verdict_text() const;
};

/// How tables name a side: "fsdp2 (torch-fsdp2)", "ddp +inject=local-mean", "external".
std::string side_title(const AuditSide& s);

}  // namespace gradcert
