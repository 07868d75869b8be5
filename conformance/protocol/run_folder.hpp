// A run folder: emptied at the start of every run, marked as gradcert's, and carrying the
// run's nonce (NOTE [run nonce] in artifacts.cpp).
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

}  // namespace gradcert
