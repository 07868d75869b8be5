#include "conformance/protocol/artifacts.hpp"

#include "conformance/core/files.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/safetensors.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gradcert {

using nlohmann::json;

void write_rank_record(const std::string& dir, int rank, int dp_rank, const std::vector<RankUpdateRecord>& updates,
                       const std::string& nonce) {
  json ups = json::array();
  for (const auto& u : updates) {
    ups.push_back({{"update", u.update}, {"consumed", u.consumed}, {"loss_sum", u.loss_sum},
                   {"valid_targets", u.valid_targets}});
    if (!u.replicas.empty()) ups.back()["replicas"] = u.replicas;
  }
  json j = {{"schema", "gradcert.rank/1"}, {"rank", rank}, {"dp_rank", dp_rank}, {"nonce", nonce}, {"updates", ups}};
  write_file_atomic(dir + "/rank" + std::to_string(rank) + ".json", j.dump(1));
}

static std::string tensor_file(int update, const char* kind) {
  return "u" + std::to_string(update) + "." + kind + ".safetensors";
}

void write_update_tensors(const std::string& dir, int update, const TensorMap& grads, const TensorMap& params) {
  write_safetensors(dir + "/" + tensor_file(update, "grads"), grads, {{"update", std::to_string(update)}});
  write_safetensors(dir + "/" + tensor_file(update, "params"), params, {{"update", std::to_string(update)}});
}

void write_manifest(const std::string& dir, const std::string& backend, int world,
                    const std::vector<ManifestUpdate>& updates, const std::string& nonce) {
  json ups = json::array();
  for (const auto& u : updates)
    ups.push_back({{"update", u.update}, {"loss", u.loss}, {"valid_targets", u.valid_targets},
                   {"step_seconds", u.step_seconds}, {"grads", tensor_file(u.update, "grads")},
                   {"params", tensor_file(u.update, "params")}});
  json j = {{"schema", "gradcert.artifacts/1"}, {"backend", backend}, {"world", world}, {"nonce", nonce},
            {"updates", ups}};
  write_file_atomic(dir + "/manifest.json", j.dump(1));
}

namespace {

// Typed, strict access to one JSON object's fields: an integer field is a JSON integer
// (never 1.0 or true), a number is a JSON number (never true), and messages name the
// file, the position and the field, echoing at most an excerpt of the value.
struct Fields {
  const json& j;
  std::string where;  // "<file>" or "<file> updates[2]"

  [[noreturn]] void fail(const std::string& what) const { throw ArtifactError(where + ": " + what); }
  const json& at(const char* key) const {
    if (!j.is_object()) fail("expected a JSON object, got " + json_excerpt(j));
    auto it = j.find(key);
    if (it == j.end()) fail(std::string("field '") + key + "' is missing");
    return *it;
  }
  int64_t integer(const char* key, int64_t lo = INT32_MIN, int64_t hi = INT32_MAX) const {
    const json& v = at(key);
    if (!v.is_number_integer()) fail(std::string("field '") + key + "' must be an integer, got " + json_excerpt(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(hi) : (v.get<int64_t>() < lo || v.get<int64_t>() > hi))
      fail(std::string("field '") + key + "' is out of range: " + json_excerpt(v));
    return v.get<int64_t>();
  }
  /// The field is JSON null (present: a missing field is still an error).
  bool null(const char* key) const { return at(key).is_null(); }
  double number(const char* key) const {
    const json& v = at(key);
    if (!v.is_number()) fail(std::string("field '") + key + "' must be a number, got " + json_excerpt(v));
    return v.get<double>();
  }
  std::string string(const char* key) const {
    const json& v = at(key);
    if (!v.is_string()) fail(std::string("field '") + key + "' must be a string, got " + json_excerpt(v));
    return v.get<std::string>();
  }
  void schema(const char* want) const {
    const json& v = at("schema");
    if (!v.is_string() || v.get<std::string>() != want)
      fail(std::string("field 'schema' must be \"") + want + "\", got " + json_excerpt(v));
  }
  // NOTE [run nonce] Every run starts from an empty run folder (prepare_run_folder) with a
  // fresh nonce, given to the ranks or the external command as GRADCERT_RUN_NONCE; the
  // manifest and every rank record echo it as "nonce". A file without it, or with another
  // run's, was not produced by this run and fails the run.
  void nonce(const std::string& expected) const {
    if (expected.empty()) fail("no run nonce to check the file against (internal error)");
    if (!j.is_object() || !j.contains("nonce"))
      fail("field 'nonce' is missing: the file was not written by this run (GRADCERT_RUN_NONCE=" + expected + ")");
    const json& v = j.at("nonce");
    if (!v.is_string() || v.get<std::string>() != expected)
      fail("nonce " + json_excerpt(v) + " is not this run's (GRADCERT_RUN_NONCE=" + expected +
           "): a file left from another run?");
  }
};

std::string at_index(const std::string& source, size_t u) { return source + " updates[" + std::to_string(u) + "]"; }

const json& updates_array(const Fields& f, size_t want) {
  const json& ups = f.at("updates");
  if (!ups.is_array()) f.fail("field 'updates' must be an array, got " + json_excerpt(ups));
  if (ups.size() != want)
    f.fail(std::to_string(ups.size()) + " updates, the plan has " + std::to_string(want));
  return ups;
}

}  // namespace

std::vector<ManifestEntry> parse_manifest_json(const std::string& text, const std::string& source, const Plan& plan,
                                               int world, const std::string& nonce) {
  const json manifest = parse_artifact_json(text, source);
  const Fields top{manifest, source};
  top.schema("gradcert.artifacts/1");
  top.nonce(nonce);
  if (top.integer("world") != world)
    top.fail("field 'world' is " + json_excerpt(manifest.at("world")) + ", the run has " + std::to_string(world));
  const json& ups = updates_array(top, plan.windows.size());
  std::vector<ManifestEntry> out(ups.size());
  for (size_t u = 0; u < ups.size(); ++u) {
    const Fields f{ups[u], at_index(source, u)};
    ManifestEntry& e = out[u];
    e.scalars.update = static_cast<int>(f.integer("update"));
    if (e.scalars.update != static_cast<int>(u)) f.fail("update index " + std::to_string(e.scalars.update));
    // null: the stack exposes no such figure (NOTE [stack figures]); absent stays an error.
    e.scalars.has_loss = !f.null("loss");
    if (e.scalars.has_loss) e.scalars.loss = f.number("loss");
    e.scalars.has_valid_targets = !f.null("valid_targets");
    if (e.scalars.has_valid_targets) e.scalars.valid_targets = f.integer("valid_targets", 0, INT64_MAX);
    e.scalars.step_seconds = f.number("step_seconds");
    for (auto [key, target] : {std::pair{"grads", &e.grads}, {"params", &e.params}}) {
      *target = f.string(key);
      const std::string& name = *target;
      if (name.empty() || name.find('/') != std::string::npos || name.find("..") != std::string::npos)
        f.fail(std::string("field '") + key + "' must be a file name inside the run directory");
    }
  }
  return out;
}

std::vector<RankRecord> parse_rank_record_json(const std::string& text, const std::string& source, const Plan& plan,
                                               int rank, const std::string& nonce) {
  const json rec = parse_artifact_json(text, source);
  const Fields top{rec, source};
  top.schema("gradcert.rank/1");
  top.nonce(nonce);
  if (top.integer("rank") != rank)
    top.fail("field 'rank' is " + json_excerpt(rec.at("rank")) + ", the file is rank " + std::to_string(rank) + "'s");
  const int dp_rank = static_cast<int>(top.integer("dp_rank"));
  if (dp_rank != plan.dp_rank_of(rank))
    top.fail("rank " + std::to_string(rank) + " says DP rank " + std::to_string(dp_rank) + ", the topology gives " +
             std::to_string(plan.dp_rank_of(rank)));
  const json& ups = updates_array(top, plan.windows.size());
  std::vector<RankRecord> out;
  for (size_t u = 0; u < ups.size(); ++u) {
    const Fields f{ups[u], at_index(source, u)};
    if (f.integer("update") != static_cast<int64_t>(u))
      f.fail("field 'update' is " + json_excerpt(ups[u].at("update")) + ", expected " + std::to_string(u));
    RankRecord rr;
    if (ups[u].contains("loss_sum")) rr.loss_sum = f.number("loss_sum"), rr.has_loss_sum = true;
    if (ups[u].contains("valid_targets")) rr.valid_targets = f.integer("valid_targets", 0, INT64_MAX);
    if (ups[u].contains("replicas")) {  // NOTE [replica digests]
      const json& reps = ups[u].at("replicas");
      if (!reps.is_object()) f.fail("field 'replicas' must be an object of tensor name -> digest, got " + json_excerpt(reps));
      for (const auto& [name, digest] : reps.items()) {
        if (name.empty() || !digest.is_string() || digest.get<std::string>().empty() || digest.get<std::string>().size() > 128)
          f.fail("field 'replicas." + name.substr(0, 80) + "' must be a digest string (1-128 characters), got " +
                 json_excerpt(digest));
        rr.replicas[name] = digest.get<std::string>();
      }
    }
    const json& consumed = f.at("consumed");
    if (!consumed.is_array()) f.fail("field 'consumed' must be an array of id lists, got " + json_excerpt(consumed));
    rr.rank = rank;
    rr.dp_rank = dp_rank;
    for (size_t a = 0; a < consumed.size(); ++a) {
      const std::string at = "consumed[" + std::to_string(a) + "]";
      if (!consumed[a].is_array()) f.fail("field '" + at + "' must be an array of sample ids, got " + json_excerpt(consumed[a]));
      std::vector<int64_t> ids;
      for (size_t i = 0; i < consumed[a].size(); ++i) {
        const json& id = consumed[a][i];
        if (!id.is_number_integer() || (id.is_number_unsigned() && id.get<uint64_t>() > uint64_t(INT64_MAX)))
          f.fail("field '" + at + "[" + std::to_string(i) + "]' must be an integer sample id, got " + json_excerpt(id));
        ids.push_back(id.get<int64_t>());
      }
      rr.consumed.push_back(std::move(ids));
    }
    out.push_back(std::move(rr));
  }
  return out;
}

std::vector<BackendUpdate> read_run(const std::string& dir, const Plan& plan, int world, const TensorMap& expected,
                                    DType dtype, const std::string& nonce) {
  std::map<std::string, TensorExpectation> expect;
  for (const auto& [name, t] : expected) expect[name] = {t.shape, dtype};
  // Reads stay inside the run folder (NOTE [artifact files]) only while it is one.
  std::error_code ec;
  if (!std::filesystem::is_directory(std::filesystem::symlink_status(dir, ec)))
    throw ArtifactError(dir + ": the run folder is no longer a folder (replaced by a symbolic link?)");

  const std::string mpath = dir + "/manifest.json";
  const auto entries = parse_manifest_json(read_text_file(mpath), mpath, plan, world, nonce);
  std::vector<BackendUpdate> run(entries.size());
  for (size_t u = 0; u < entries.size(); ++u) {
    auto& bu = run[u];
    bu.update = entries[u].scalars.update;
    bu.loss = entries[u].scalars.loss;
    bu.valid_targets = entries[u].scalars.valid_targets;
    bu.has_loss = entries[u].scalars.has_loss;
    bu.has_valid_targets = entries[u].scalars.has_valid_targets;
    bu.step_seconds = entries[u].scalars.step_seconds;
    bu.grads = read_safetensors(dir + "/" + entries[u].grads, expect);
    bu.params_after = read_safetensors(dir + "/" + entries[u].params, expect);
  }
  for (int r = 0; r < world; ++r) {
    const std::string rpath = dir + "/rank" + std::to_string(r) + ".json";
    auto records = parse_rank_record_json(read_text_file(rpath), rpath, plan, r, nonce);
    for (size_t u = 0; u < records.size(); ++u) run[u].ranks.push_back(std::move(records[u]));
  }
  return run;
}

void write_rank_memory(const std::string& dir, const RankMemory& m) {
  json peaks = json::array();
  for (const auto& p : m.peaks)
    peaks.push_back({{"bucket", p.bucket},
                     {"phase", p.phase},
                     {"device", p.device},
                     {"peak_bytes", p.peak_bytes},
                     {"current_bytes", p.current_bytes},
                     {"seconds", p.seconds},
                     {"process_high_water_bytes", p.process_high_water_bytes}});
  json j = {{"schema", "gradcert.memory/1"},
            {"rank", m.rank},
            {"model_state_bytes", m.model_state_bytes},
            {"model_state_tensors", m.model_state_tensors},
            {"checkpoint_bytes", m.checkpoint_bytes},
            {"process_high_water_bytes", m.process_high_water_bytes},
            {"peaks", peaks}};
  write_file_atomic(dir + "/rank" + std::to_string(m.rank) + ".memory.json", j.dump(1));
}

RankMemory read_rank_memory(const std::string& dir, int rank) {
  const std::string path = dir + "/rank" + std::to_string(rank) + ".memory.json";
  const json j = parse_artifact_json(read_text_file(path), path);
  const Fields f{j, path};
  f.schema("gradcert.memory/1");
  RankMemory m;
  m.rank = static_cast<int>(f.integer("rank"));
  if (m.rank != rank) f.fail("rank " + std::to_string(m.rank) + ", expected " + std::to_string(rank));
  m.model_state_bytes = f.integer("model_state_bytes", -1, INT64_MAX);
  m.model_state_tensors = f.integer("model_state_tensors", 0, INT64_MAX);
  m.checkpoint_bytes = f.integer("checkpoint_bytes", 0, INT64_MAX);
  m.process_high_water_bytes = f.integer("process_high_water_bytes", -1, INT64_MAX);
  const json& peaks = f.at("peaks");
  if (!peaks.is_array()) f.fail("field 'peaks' is not an array");
  for (size_t i = 0; i < peaks.size(); ++i) {
    const Fields pf{peaks[i], path + ": peaks[" + std::to_string(i) + "]"};
    PhasePeak p;
    p.rank = rank;
    p.bucket = pf.string("bucket");
    p.phase = pf.string("phase");
    p.device = pf.string("device");
    p.peak_bytes = pf.integer("peak_bytes", INT64_MIN, INT64_MAX);
    p.current_bytes = pf.integer("current_bytes", INT64_MIN, INT64_MAX);
    p.seconds = pf.number("seconds");
    p.process_high_water_bytes = pf.integer("process_high_water_bytes", INT64_MIN, INT64_MAX);
    m.peaks.push_back(p);
  }
  return m;
}

}  // namespace gradcert
