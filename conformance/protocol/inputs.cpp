#include "conformance/protocol/inputs.hpp"

#include <cstdint>
#include <nlohmann/json.hpp>

#include "conformance/core/files.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/core/tensors.hpp"

namespace gradcert {

namespace {

using nlohmann::json;

struct Reader {
  std::string source;
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw ArtifactError(source + ": " + field + ": " + what);
  }
  const json& at(const json& j, const char* key, const std::string& field) const {
    if (!j.is_object() || !j.contains(key)) fail(field.empty() ? key : field + "." + key, "missing");
    return j.at(key);
  }
  int64_t integer(const json& j, const std::string& field) const {
    if (!j.is_number_integer()) fail(field, "expected an integer, got " + json_excerpt(j));
    if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX)) fail(field, "integer out of range");
    return j.get<int64_t>();
  }
  int int32(const json& j, const std::string& field) const {
    const int64_t v = integer(j, field);
    if (v < INT32_MIN || v > INT32_MAX) fail(field, "integer out of range");
    return static_cast<int>(v);
  }
  bool boolean(const json& j, const std::string& field) const {
    if (!j.is_boolean()) fail(field, "expected true or false, got " + std::string(j.type_name()));
    return j.get<bool>();
  }
  const json& array(const json& j, const std::string& field, size_t expected = SIZE_MAX) const {
    if (!j.is_array()) fail(field, "expected an array, got " + std::string(j.type_name()));
    if (expected != SIZE_MAX && j.size() != expected)
      fail(field, "expected " + std::to_string(expected) + " entries, got " + std::to_string(j.size()));
    return j;
  }
  std::vector<int64_t> ids(const json& j, const std::string& field) const {
    std::vector<int64_t> out;
    for (size_t i = 0; i < array(j, field).size(); ++i)
      out.push_back(integer(j[i], field + "[" + std::to_string(i) + "]"));
    return out;
  }
};

}  // namespace

Plan parse_plan_json(const std::string& text, const std::string& source, Spec* spec_out) {
  const Reader rd{source};
  const json j = parse_artifact_json(text, source);
  if (!j.is_object() || !j.contains("schema") || j["schema"] != "gradcert.plan/1")
    rd.fail("schema", "expected \"gradcert.plan/1\"");
  const Spec spec = parse_spec(rd.at(j, "spec", "").dump(), source + " (spec)");
  Plan p;
  const json& topo = rd.at(j, "topology", "");
  p.dp = rd.int32(rd.at(topo, "dp", "topology"), "topology.dp");
  p.tp = rd.int32(rd.at(topo, "tp", "topology"), "topology.tp");
  p.pp = rd.int32(rd.at(topo, "pp", "topology"), "topology.pp");
  if (p.dp != spec.topology.dp || p.tp != spec.topology.tp || p.pp != spec.topology.pp)
    rd.fail("topology", "differs from the spec's topology");
  p.micro = spec.batch.micro;
  p.accum = spec.batch.accum;
  p.update_batch = rd.integer(rd.at(j, "update_batch", ""), "update_batch");
  if (p.update_batch != update_batch_size(p.micro, p.accum, p.dp)) rd.fail("update_batch", "is not B_micro x A x D");
  p.windows_per_epoch = rd.int32(rd.at(j, "windows_per_epoch", ""), "windows_per_epoch");
  const json& windows = rd.array(rd.at(j, "windows", ""), "windows");
  for (size_t u = 0; u < windows.size(); ++u) {
    const std::string wf = "windows[" + std::to_string(u) + "]";
    const json& wj = windows[u];
    Window w;
    w.update = rd.int32(rd.at(wj, "update", wf), wf + ".update");
    if (w.update != static_cast<int>(u)) rd.fail(wf + ".update", "expected " + std::to_string(u));
    w.epoch = rd.int32(rd.at(wj, "epoch", wf), wf + ".epoch");
    w.index_in_epoch = p.windows_per_epoch > 0 ? w.update - w.epoch * p.windows_per_epoch : 0;
    w.partial = rd.boolean(rd.at(wj, "partial", wf), wf + ".partial");
    w.ids = rd.ids(rd.at(wj, "ids", wf), wf + ".ids");
    w.valid_targets = rd.integer(rd.at(wj, "valid_targets", wf), wf + ".valid_targets");
    const json& slots = rd.array(rd.at(wj, "slots", wf), wf + ".slots", static_cast<size_t>(p.dp));
    for (int r = 0; r < p.dp; ++r) {
      const std::string rf = wf + ".slots[" + std::to_string(r) + "]";
      const json& row = rd.array(slots[r], rf, static_cast<size_t>(p.accum));
      std::vector<Microbatch> mbs;
      for (int a = 0; a < p.accum; ++a) {
        const std::string mf = rf + "[" + std::to_string(a) + "]";
        Microbatch mb;
        mb.ids = rd.ids(rd.at(row[a], "ids", mf), mf + ".ids");
        mb.input_tokens = rd.integer(rd.at(row[a], "input_tokens", mf), mf + ".input_tokens");
        mb.valid_targets = rd.integer(rd.at(row[a], "valid_targets", mf), mf + ".valid_targets");
        mbs.push_back(std::move(mb));
      }
      w.slots.push_back(std::move(mbs));
    }
    p.windows.push_back(std::move(w));
  }
  if (spec_out) *spec_out = spec;
  return p;
}

Plan read_plan_file(const std::string& path, Spec* spec) { return parse_plan_json(read_text_file(path), path, spec); }

}  // namespace gradcert
