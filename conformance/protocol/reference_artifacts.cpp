#include "conformance/protocol/reference_artifacts.hpp"

#include <nlohmann/json.hpp>

#include "conformance/core/files.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/safetensors.hpp"

namespace gradcert {

namespace {

using nlohmann::json;

// Strictly, like a stack's files: depth bounded, duplicate keys refused (core/strict_json.hpp).
json parse_file(const std::string& path) { return parse_artifact_json(read_text_file(path), path); }

int64_t integer(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer())
    throw ArtifactError(where + ": '" + key + "' missing or not an integer");
  return j[key].get<int64_t>();
}

double number(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number())
    throw ArtifactError(where + ": '" + key + "' missing or not a number");
  return j[key].get<double>();
}

// The runner's "floor" object of an update (absent: not measured).
UpdateFloor floor_of(const json& e, const std::string& where) {
  UpdateFloor f;
  if (!e.is_object() || !e.contains("floor")) return f;
  const json& j = e["floor"];
  const std::string at = where + ".floor";
  f.grad = number(j, "grad", at);
  f.scale = number(j, "scale", at);
  f.loss = number(j, "loss", at);
  f.params = number(j, "params", at);
  f.measured = true;
  return f;
}

}  // namespace

ReferenceRun read_reference_run(const std::string& dir, const Plan& plan, const TensorMap& expected) {
  const std::string mpath = dir + "/manifest.json";
  const json m = parse_file(mpath);
  if (!m.is_object() || !m.contains("updates") || !m["updates"].is_array())
    throw ArtifactError(mpath + ": 'updates' missing or not an array");
  if (m["updates"].size() != plan.windows.size())
    throw ArtifactError(mpath + ": " + std::to_string(m["updates"].size()) + " updates, the plan has " +
                        std::to_string(plan.windows.size()));
  std::map<std::string, TensorExpectation> expect;
  for (const auto& [name, t] : expected) expect[name] = {t.shape, DType::Float64};
  ReferenceRun out;
  if (m.contains("reference") && m["reference"].is_object())
    out.pieces_at_stack = m["reference"].value("pieces_at", std::string()) == "stack";
  if (m.contains("precision") && m["precision"].is_object()) {
    const json& p = m["precision"];
    out.float64_throughout = p.value("float64_throughout", true);
    if (!out.float64_throughout) out.precision_note = json_excerpt(p, 400);
    for (const char* list : {"lower_precision_ops", "lower_precision_modules"})
      if (p.contains(list) && p[list].is_array())
        for (const auto& e : p[list]) {
          const std::string d = e.is_object() ? e.value("dtype", std::string()) : std::string();
          if (d == "bfloat16" || d == "float16" || (d == "float32" && out.lowest_inner_dtype.empty()))
            out.lowest_inner_dtype = d;
        }
    if (!out.float64_throughout && out.lowest_inner_dtype.empty()) out.lowest_inner_dtype = "float32";
  }
  for (size_t u = 0; u < plan.windows.size(); ++u) {
    const json& e = m["updates"][u];
    const std::string where = mpath + ": updates[" + std::to_string(u) + "]";
    ReferenceUpdate r;
    r.update = static_cast<int>(integer(e, "update", where));
    if (r.update != static_cast<int>(u)) throw ArtifactError(where + ": update " + std::to_string(r.update));
    r.loss = number(e, "loss", where);
    r.valid_targets = integer(e, "valid_targets", where);
    r.grads = read_safetensors(dir + "/u" + std::to_string(u) + ".grads.safetensors", expect);
    r.params_after = read_safetensors(dir + "/u" + std::to_string(u) + ".params.safetensors", expect);
    r.floor = floor_of(e, where);
    out.updates.push_back(std::move(r));
    if (e.contains("forced")) {  // NOTE [teacher forcing]: at the stack's parameters after update u-1
      const json& fj = e["forced"];
      const std::string fwhere = where + ".forced";
      ReferenceUpdate f;
      f.update = static_cast<int>(u);
      f.loss = number(fj, "loss", fwhere);
      f.valid_targets = integer(fj, "valid_targets", fwhere);
      f.grads = read_safetensors(dir + "/u" + std::to_string(u) + ".forced.grads.safetensors", expect);
      f.params_after = read_safetensors(dir + "/u" + std::to_string(u) + ".forced.params.safetensors", expect);
      f.floor = floor_of(fj, fwhere);
      out.forced.push_back(std::move(f));
    }
    if (!e.contains("pieces_json")) continue;
    const std::string ppath = dir + "/u" + std::to_string(u) + ".pieces.json";
    const json pj = parse_file(ppath);
    UpdatePieces up;
    up.update = static_cast<int>(u);
    up.partial = pj.value("partial", false);
    up.valid_targets = integer(pj, "valid_targets", ppath);
    std::map<std::string, TensorExpectation> pexpect;
    if (!pj.contains("pieces") || !pj["pieces"].is_array()) throw ArtifactError(ppath + ": 'pieces' missing");
    for (const auto& p : pj["pieces"]) {
      PieceMeta pm;
      pm.dp_rank = static_cast<int>(integer(p, "dp_rank", ppath));
      pm.micro = static_cast<int>(integer(p, "micro", ppath));
      pm.loss_sum = number(p, "loss_sum", ppath);
      pm.valid_targets = integer(p, "valid_targets", ppath);
      pm.rows_with_targets = integer(p, "rows_with_targets", ppath);
      up.meta.push_back(pm);
      for (const auto& [name, t] : expected)
        pexpect["r" + std::to_string(pm.dp_rank) + ".a" + std::to_string(pm.micro) + "." + name] = {t.shape,
                                                                                                    DType::Float64};
    }
    up.grads = read_safetensors(dir + "/u" + std::to_string(u) + ".pieces.safetensors", pexpect);
    auto& sums = out.updates.back().rank_loss_sums;
    sums.assign(plan.dp, 0.0);
    for (const auto& pm : up.meta)
      if (pm.dp_rank >= 0 && pm.dp_rank < plan.dp) sums[pm.dp_rank] += pm.loss_sum;
    if (out.forced.size() == out.updates.size()) out.forced.back().rank_loss_sums = sums;
    out.pieces.push_back(std::move(up));
  }
  if (!out.forced.empty() && out.forced.size() != out.updates.size())
    throw ArtifactError(mpath + ": " + std::to_string(out.forced.size()) + " of " + std::to_string(out.updates.size()) +
                        " updates carry a teacher-forced reference");
  return out;
}

}  // namespace gradcert
