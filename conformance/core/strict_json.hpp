// JSON as gradcert reads its inputs: duplicate keys rejected, nesting bounded, and values
// echoed in messages only as short excerpts (NOTE [strict json]).
#pragma once
#include <cstddef>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace gradcert {

/// The deepest nesting any gradcert reader accepts (objects and arrays counted alike).
constexpr int kMaxJsonDepth = 64;

/// Why a text was refused.
struct JsonProblem {
  enum class Kind { Syntax, DuplicateKey, TooDeep, NumberRange };
  Kind kind = Kind::Syntax;
  /// Where: "updates[2].loss" ("" = the top level). For DuplicateKey it ends with the key.
  std::string path;
  std::string key;   ///< DuplicateKey: the key given twice
  std::string what;  ///< one phrase: "duplicate key 'loss'", "nested deeper than 64 levels", ...
  /// "<path>: <what>", or just <what> at the top level.
  std::string message() const { return path.empty() ? what : path + ": " + what; }
};

/// Parses `text` strictly into `out`: a key given twice in one object, nesting deeper than
/// `max_depth`, a number out of double range or malformed JSON yields the problem (and
/// `out` is left unspecified). Never recurses on the input's depth.
std::optional<JsonProblem> parse_json_strict(const std::string& text, nlohmann::json& out,
                                             int max_depth = kMaxJsonDepth);

/// parse_json_strict for an artifact: throws ArtifactError "<source>: <problem>".
nlohmann::json parse_artifact_json(const std::string& text, const std::string& source);

/// At most `max_chars` characters of `v` as JSON text, "..." appended when cut; nesting
/// below kMaxJsonDepth is elided, so any value is safe to echo in a message.
std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 60);

}  // namespace gradcert
