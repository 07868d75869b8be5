#include "conformance/protocol/artifacts.hpp"

#include "conformance/core/files.hpp"
#include "conformance/protocol/safetensors.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gradcert {

using nlohmann::json;

void write_rank_record(const std::string& dir, int rank, int dp_rank, const std::vector<RankUpdateRecord>& updates) {
  json ups = json::array();
  for (const auto& u : updates)
    ups.push_back({{"update", u.update}, {"consumed", u.consumed}, {"loss_sum", u.loss_sum},
                   {"valid_targets", u.valid_targets}});
  json j = {{"schema", "gradcert.rank/1"}, {"rank", rank}, {"dp_rank", dp_rank}, {"updates", ups}};
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
                    const std::vector<ManifestUpdate>& updates) {
  json ups = json::array();
  for (const auto& u : updates)
    ups.push_back({{"update", u.update}, {"loss", u.loss}, {"valid_targets", u.valid_targets},
                   {"step_seconds", u.step_seconds}, {"grads", tensor_file(u.update, "grads")},
                   {"params", tensor_file(u.update, "params")}});
  json j = {{"schema", "gradcert.artifacts/1"}, {"backend", backend}, {"world", world}, {"updates", ups}};
  write_file_atomic(dir + "/manifest.json", j.dump(1));
}

namespace {

json parse_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw ArtifactError(path + ": not valid JSON: " + e.what());
  }
}

template <class T>
T field(const json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw ArtifactError(where + ": field '" + key + "' is missing");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw ArtifactError(where + ": field '" + key + "' has the wrong type: " + j.at(key).dump());
  }
}

}  // namespace

std::vector<BackendUpdate> read_run(const std::string& dir, const Plan& plan, int world, const TensorMap& expected,
                                    DType dtype) {
  std::map<std::string, TensorExpectation> expect;
  for (const auto& [name, t] : expected) expect[name] = {t.shape, dtype};

  const std::string mpath = dir + "/manifest.json";
  json manifest = parse_json_file(mpath);
  auto mups = field<json>(manifest, "updates", mpath);
  if (!mups.is_array()) throw ArtifactError(mpath + ": field 'updates' must be an array");
  if (mups.size() != plan.windows.size())
    throw ArtifactError(mpath + ": " + std::to_string(mups.size()) + " updates, the plan has " +
                        std::to_string(plan.windows.size()));

  std::vector<BackendUpdate> run(plan.windows.size());
  for (size_t u = 0; u < mups.size(); ++u) {
    const std::string where = mpath + " updates[" + std::to_string(u) + "]";
    auto& bu = run[u];
    bu.update = field<int>(mups[u], "update", where);
    if (bu.update != static_cast<int>(u)) throw ArtifactError(where + ": update index " + std::to_string(bu.update));
    bu.loss = field<double>(mups[u], "loss", where);
    bu.valid_targets = field<int64_t>(mups[u], "valid_targets", where);
    bu.step_seconds = field<double>(mups[u], "step_seconds", where);
    for (auto [key, target] : {std::pair{"grads", &bu.grads}, {"params", &bu.params_after}}) {
      auto name = field<std::string>(mups[u], key, where);
      if (name.empty() || name.find('/') != std::string::npos || name.find("..") != std::string::npos)
        throw ArtifactError(where + ": field '" + key + "' must be a file name inside the run directory");
      *target = read_safetensors(dir + "/" + name, expect);
    }
  }
  for (int r = 0; r < world; ++r) {
    const std::string rpath = dir + "/rank" + std::to_string(r) + ".json";
    json rec = parse_json_file(rpath);
    const int dp_rank = field<int>(rec, "dp_rank", rpath);
    if (dp_rank != plan.dp_rank_of(r))
      throw ArtifactError(rpath + ": rank " + std::to_string(r) + " says DP rank " + std::to_string(dp_rank) +
                          ", the topology gives " + std::to_string(plan.dp_rank_of(r)));
    auto ups = field<json>(rec, "updates", rpath);
    if (!ups.is_array() || ups.size() != plan.windows.size())
      throw ArtifactError(rpath + ": rank " + std::to_string(r) + " reported " +
                          std::to_string(ups.is_array() ? ups.size() : 0) + " updates, the plan has " +
                          std::to_string(plan.windows.size()));
    for (size_t u = 0; u < ups.size(); ++u) {
      RankRecord rr;
      rr.rank = r;
      rr.dp_rank = dp_rank;
      rr.consumed = field<std::vector<std::vector<int64_t>>>(ups[u], "consumed", rpath + " updates[" + std::to_string(u) + "]");
      run[u].ranks.push_back(std::move(rr));
    }
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
  const json j = parse_json_file(path);
  if (field<std::string>(j, "schema", path) != "gradcert.memory/1")
    throw ArtifactError(path + ": schema is not gradcert.memory/1");
  RankMemory m;
  m.rank = field<int>(j, "rank", path);
  if (m.rank != rank) throw ArtifactError(path + ": rank " + std::to_string(m.rank) + ", expected " + std::to_string(rank));
  m.model_state_bytes = field<int64_t>(j, "model_state_bytes", path);
  m.model_state_tensors = field<int64_t>(j, "model_state_tensors", path);
  m.checkpoint_bytes = field<int64_t>(j, "checkpoint_bytes", path);
  m.process_high_water_bytes = field<int64_t>(j, "process_high_water_bytes", path);
  const json peaks = field<json>(j, "peaks", path);
  if (!peaks.is_array()) throw ArtifactError(path + ": field 'peaks' is not an array");
  for (size_t i = 0; i < peaks.size(); ++i) {
    const std::string where = path + ": peaks[" + std::to_string(i) + "]";
    PhasePeak p;
    p.rank = rank;
    p.bucket = field<std::string>(peaks[i], "bucket", where);
    p.phase = field<std::string>(peaks[i], "phase", where);
    p.device = field<std::string>(peaks[i], "device", where);
    p.peak_bytes = field<int64_t>(peaks[i], "peak_bytes", where);
    p.current_bytes = field<int64_t>(peaks[i], "current_bytes", where);
    p.seconds = field<double>(peaks[i], "seconds", where);
    p.process_high_water_bytes = field<int64_t>(peaks[i], "process_high_water_bytes", where);
    m.peaks.push_back(p);
  }
  return m;
}

}  // namespace gradcert
