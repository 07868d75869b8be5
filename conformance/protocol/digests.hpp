// The digests of a run's artifacts (NOTE [artifact digests]).
#pragma once
#include <string>

namespace gradcert {

// NOTE [artifact digests] When a run's ranks (or a stack's command, or an observed job) have
// ended, gradcert writes <run>/digests.json (schema "gradcert.digests/1", the run's nonce): the
// SHA-256 of every regular file in the run folder, sub-folders included, except digests.json and
// gradcert's own scratch of the checks (reference/ and reference-log/, which `gradcert check`
// recomputes). `gradcert check` recomputes every digest before it reads anything else and refuses
// the folder naming the first file whose bytes changed or that is gone, so an archived
// certification is the bytes the run produced. A file added later is not covered and not read
// (the checks read only the files the protocol names).
constexpr const char* kDigestsFile = "digests.json";

/// Writes <dir>/digests.json for the files in `dir` now.
void write_digests(const std::string& dir, const std::string& nonce);
/// Recomputes every digest <dir>/digests.json lists; throws ArtifactError naming the first file
/// that differs or is missing, or digests.json itself when it is missing, malformed or another run's.
void verify_digests(const std::string& dir, const std::string& nonce);

}  // namespace gradcert
