// A run folder: emptied at the start of every run, marked as gradcert's, and carrying the
// run's nonce (NOTE [run nonce] in fields.hpp).
#pragma once
#include <string>

namespace gradcert {

/// The marker file gradcert writes into every run folder it makes (JSON: schema
/// "gradcert.run-folder/1", "nonce").
constexpr const char* kRunFolderMarker = ".gradcert-run";

/// Makes `dir` an empty run folder for a new run and returns the run's fresh nonce (32 hex
/// digits), also written into the marker. A missing folder is created (parents too); an
/// empty folder is used; a folder with the marker (one gradcert made) is removed and made
/// anew. Anything else (a file, a symbolic link, a folder with other content and no marker)
/// throws std::invalid_argument naming the path, and nothing is removed.
std::string prepare_run_folder(const std::string& dir);

/// The nonce in `dir`'s marker; throws ArtifactError naming the marker when it is missing
/// or malformed.
std::string run_folder_nonce(const std::string& dir);

/// A fresh random nonce: 32 lowercase hex digits.
std::string make_run_nonce();

/// The file that says what a run folder is the run of: <dir>/run.json (NOTE [run record]).
constexpr const char* kRunRecordFile = "run.json";

/// What `gradcert check` needs to re-check a run folder beyond its spec, plan and artifacts.
struct RunRecord {
  std::string backend;             ///< built-in name, or "external"
  int world = 0, tp = 1, pp = 1;   ///< the run's resolved topology (dp = world / (tp x pp))
  std::string launcher = "local";  ///< "local" | "mpirun"
  std::string inject;              ///< the planted bug, "" for none
  bool sampler_audit = false;      ///< external: the stack sampled on its own
  std::string command;             ///< external: the command that ran the stack ("" otherwise)
  std::string nonce;               ///< the run's nonce (NOTE [run nonce])
};

/// Writes <dir>/run.json (schema "gradcert.run/1").
void write_run_record(const std::string& dir, const RunRecord& record);
/// Reads <dir>/run.json strictly: every field present and of its type, world >= 1, tp, pp
/// >= 1 dividing it, a non-empty nonce. Throws ArtifactError naming the file and the field.
RunRecord read_run_record(const std::string& dir);

}  // namespace gradcert
