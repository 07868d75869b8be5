#include "conformance/protocol/checkpoint.hpp"

#include "conformance/core/files.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/artifacts.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

namespace gradcert {

using nlohmann::json;

// NOTE [checkpoint format] A checkpoint is the layout-independent form of a run's state after
// K updates, so a leg of another strategy (or layout) can load it: every rank writes
// rank<r>.safetensors with the pieces it holds, placed exactly as the shard artifacts are
// (NOTE [shard artifacts]: canonical name, global shape, flat range or box, replica group 0),
// and rank 0 writes checkpoint.json with the scalars. The tensors, in the dtype the optimizer
// steps: "param.<p>" (the float32 master in bfloat16 runs) and "optim.<p>.m" / ".v" (momentum,
// AdamW's moments). A reader assembles each canonical tensor from any rank's pieces, so the
// saving and loading layouts are independent. Not covered (yet): lr schedulers, RNG state,
// gradient scalers, a partial accumulation window (a leg always ends on a window boundary).

std::string checkpoint_file(int rank) { return "rank" + std::to_string(rank) + ".safetensors"; }

void write_checkpoint_record(const std::string& dir, const CheckpointRecord& r) {
  json j = {{"schema", "gradcert.checkpoint/1"},
            {"backend", r.backend},
            {"world", r.world},
            {"updates_done", r.updates_done},
            {"optimizer_step", r.optimizer_step},
            {"sampler", {{"epoch", r.next_epoch}, {"index_in_epoch", r.next_index_in_epoch}}},
            {"nonce", r.nonce}};
  write_file_atomic(dir + "/checkpoint.json", j.dump(1));
}

namespace {

int64_t integer_field(const json& j, const char* key, const std::string& where, int64_t lo, int64_t hi) {
  if (!j.is_object() || !j.contains(key)) throw ArtifactError(where + ": field '" + key + "' is missing");
  const json& v = j.at(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) || v.get<int64_t>() < lo ||
      v.get<int64_t>() > hi)
    throw ArtifactError(where + ": field '" + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "], got " + json_excerpt(v));
  return v.get<int64_t>();
}

std::string string_field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw ArtifactError(where + ": field '" + key + "' is missing");
  if (!j.at(key).is_string())
    throw ArtifactError(where + ": field '" + key + "' must be a string, got " + json_excerpt(j.at(key)));
  return j.at(key).get<std::string>();
}

}  // namespace

CheckpointRecord parse_checkpoint_record(const std::string& text, const std::string& source, const std::string& nonce) {
  const json j = parse_artifact_json(text, source);
  if (!j.is_object()) throw ArtifactError(source + ": expected a JSON object, got " + json_excerpt(j));
  if (string_field(j, "schema", source) != "gradcert.checkpoint/1")
    throw ArtifactError(source + ": field 'schema' must be \"gradcert.checkpoint/1\", got " +
                        json_excerpt(j.at("schema")));
  CheckpointRecord r;
  r.nonce = string_field(j, "nonce", source);
  if (r.nonce != nonce)
    throw ArtifactError(source + ": nonce " + json_excerpt(j.at("nonce")) +
                        " is not this run's (GRADCERT_RUN_NONCE=" + nonce + "): a checkpoint of another run?");
  r.backend = string_field(j, "backend", source);
  r.world = static_cast<int>(integer_field(j, "world", source, 1, 1 << 20));
  r.updates_done = static_cast<int>(integer_field(j, "updates_done", source, 0, INT32_MAX));
  r.optimizer_step = integer_field(j, "optimizer_step", source, 0, INT64_MAX);
  if (!j.contains("sampler")) throw ArtifactError(source + ": field 'sampler' is missing");
  r.next_epoch = static_cast<int>(integer_field(j.at("sampler"), "epoch", source + " sampler", 0, INT32_MAX));
  r.next_index_in_epoch =
      static_cast<int>(integer_field(j.at("sampler"), "index_in_epoch", source + " sampler", 0, INT32_MAX));
  return r;
}

DType checkpoint_dtype(DType run) { return run == DType::BFloat16 ? DType::Float32 : run; }

std::vector<std::string> optimizer_slots(const OptimizerSpec& opt) {
  if (opt.name == "adamw") return {"m", "v"};
  return opt.momentum != 0 ? std::vector<std::string>{"m"} : std::vector<std::string>{};
}

std::map<std::string, TensorExpectation> checkpoint_expectation(const TensorMap& shapes, const OptimizerSpec& opt,
                                                                DType run) {
  std::map<std::string, TensorExpectation> out;
  for (const auto& [name, t] : shapes) {
    out["param." + name] = {t.shape, checkpoint_dtype(run)};
    for (const auto& slot : optimizer_slots(opt)) out["optim." + name + "." + slot] = {t.shape, checkpoint_dtype(run)};
  }
  return out;
}

Checkpoint read_checkpoint(const std::string& dir, int world, const std::map<std::string, TensorExpectation>& expect,
                           const std::string& nonce) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(dir, ec)))
    throw ArtifactError(dir + ": no checkpoint folder (the first leg saved nothing)");
  Checkpoint cp;
  cp.record = parse_checkpoint_record(read_text_file(dir + "/checkpoint.json"), dir + "/checkpoint.json", nonce);
  if (world == 0) world = cp.record.world;
  if (cp.record.world != world)
    throw ArtifactError(dir + "/checkpoint.json: field 'world' is " + std::to_string(cp.record.world) +
                        ", the first leg ran " + std::to_string(world) + " ranks");
  std::vector<std::string> files;
  std::string missing;
  for (int r = 0; r < world; ++r) {
    if (fs::exists(fs::symlink_status(dir + "/" + checkpoint_file(r), ec)))
      files.push_back(checkpoint_file(r));
    else
      missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(r) + " wrote no " + checkpoint_file(r);
  }
  try {
    if (files.empty()) throw ArtifactError(dir + ": no rank wrote its file");
    auto groups =
        read_placed(dir, files, expect, "checkpoint after update " + std::to_string(cp.record.updates_done - 1));
    if (!groups.count(0))
      throw ArtifactError(dir + ": the checkpoint holds no replica group 0 (every saving rank writes group 0)");
    cp.tensors = std::move(groups.at(0));
  } catch (const ArtifactError& e) {
    if (missing.empty()) throw;
    throw ArtifactError(missing + " (every rank writes its file), so " + e.what());
  }
  if (!missing.empty())
    throw ArtifactError(dir + ": " + missing + " (every rank writes its file, possibly with no tensor)");
  return cp;
}

}  // namespace gradcert
