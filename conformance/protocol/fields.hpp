// Typed, strict access to one JSON object's fields, for the readers of what ranks and jobs
// write (artifacts.cpp, observed.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "conformance/core/strict_json.hpp"
#include "conformance/core/tensors.hpp"

namespace gradcert {

// Typed, strict access to one JSON object's fields: an integer field is a JSON integer
// (never 1.0 or true), a number is a JSON number (never true), and messages name the
// file, the position and the field, echoing at most an excerpt of the value.
struct Fields {
  const nlohmann::json& j;
  std::string where;  // "<file>" or "<file> updates[2]"

  [[noreturn]] void fail(const std::string& what) const { throw ArtifactError(where + ": " + what); }
  const nlohmann::json& at(const char* key) const {
    if (!j.is_object()) fail("expected a JSON object, got " + json_excerpt(j));
    auto it = j.find(key);
    if (it == j.end()) fail(std::string("field '") + key + "' is missing");
    return *it;
  }
  int64_t integer(const char* key, int64_t lo = INT32_MIN, int64_t hi = INT32_MAX) const {
    const nlohmann::json& v = at(key);
    if (!v.is_number_integer()) fail(std::string("field '") + key + "' must be an integer, got " + json_excerpt(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(hi) : (v.get<int64_t>() < lo || v.get<int64_t>() > hi))
      fail(std::string("field '") + key + "' is out of range: " + json_excerpt(v));
    return v.get<int64_t>();
  }
  /// The field is JSON null (present: a missing field is still an error).
  bool null(const char* key) const { return at(key).is_null(); }
  double number(const char* key) const {
    const nlohmann::json& v = at(key);
    if (!v.is_number()) fail(std::string("field '") + key + "' must be a number, got " + json_excerpt(v));
    return v.get<double>();
  }
  /// A loss or loss sum: a JSON number, or "nan", "inf", "-inf" for a non-finite one (NOTE
  /// [non-finite values]: JSON has no NaN; a non-finite value is a training finding).
  double measured(const char* key) const {
    const nlohmann::json& v = at(key);
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
      if (s == "inf" || s == "-inf") return s == "inf" ? HUGE_VAL : -HUGE_VAL;
    }
    if (!v.is_number())
      fail(std::string("field '") + key + "' must be a number (or \"nan\", \"inf\", \"-inf\"), got " + json_excerpt(v));
    return v.get<double>();
  }
  std::string string(const char* key) const {
    const nlohmann::json& v = at(key);
    if (!v.is_string()) fail(std::string("field '") + key + "' must be a string, got " + json_excerpt(v));
    return v.get<std::string>();
  }
  void schema(const char* want) const {
    const nlohmann::json& v = at("schema");
    if (!v.is_string() || v.get<std::string>() != want)
      fail(std::string("field 'schema' must be \"") + want + "\", got " + json_excerpt(v));
  }
  bool boolean(const char* key) const {
    const nlohmann::json& v = at(key);
    if (!v.is_boolean()) fail(std::string("field '") + key + "' must be true or false, got " + json_excerpt(v));
    return v.get<bool>();
  }
  // NOTE [run nonce] Every run starts from an empty run folder (prepare_run_folder) with a
  // fresh nonce, given to the ranks or the external command as GRADCERT_RUN_NONCE; the
  // manifest and every rank record echo it as "nonce". A file without it, or with another
  // run's, was not produced by this run and fails the run.
  void nonce(const std::string& expected) const {
    if (expected.empty()) fail("no run nonce to check the file against (internal error)");
    if (!j.is_object() || !j.contains("nonce"))
      fail("field 'nonce' is missing: the file was not written by this run (GRADCERT_RUN_NONCE=" + expected +
           "), or by a stack that does not echo the nonce: protocol version 1 had none, version 2 requires it in "
           "manifest.json and every rank<g>.json (backends/PROTOCOL.md)");
    const nlohmann::json& v = j.at("nonce");
    if (!v.is_string() || v.get<std::string>() != expected)
      fail("nonce " + json_excerpt(v) + " is not this run's (GRADCERT_RUN_NONCE=" + expected +
           "): a file left from another run?");
  }
};

}  // namespace gradcert
