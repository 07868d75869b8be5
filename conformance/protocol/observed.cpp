#include "conformance/protocol/observed.hpp"

#include <algorithm>
#include <filesystem>
#include <regex>

#include "conformance/core/files.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/fields.hpp"

namespace gradcert {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const json& array_field(const Fields& f, const char* key) {
  const json& v = f.at(key);
  if (!v.is_array()) f.fail(std::string("field '") + key + "' must be an array, got " + json_excerpt(v));
  return v;
}

std::vector<int64_t> int_list(const Fields& f, const char* key) {
  const json& v = array_field(f, key);
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer())
      f.fail(std::string("field '") + key + "[" + std::to_string(i) + "]' must be an integer, got " +
             json_excerpt(v[i]));
    out.push_back(v[i].get<int64_t>());
  }
  return out;
}

std::vector<std::string> string_list(const Fields& f, const char* key) {
  const json& v = array_field(f, key);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      f.fail(std::string("field '") + key + "[" + std::to_string(i) + "]' must be a string, got " + json_excerpt(v[i]));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

// A plain file name inside the folder (the manifest names the same files).
std::string file_name(const Fields& f, const std::string& name, const char* key) {
  if (name.empty() || name.find('/') != std::string::npos || name.find("..") != std::string::npos)
    f.fail(std::string("field '") + key + "' must name files inside the folder, got " + json_excerpt(name));
  return name;
}

std::vector<std::string> files_field(const Fields& f, const char* key, bool& sharded) {
  const json& v = f.at(key);
  if (v.is_string()) {
    sharded = false;
    return {file_name(f, v.get<std::string>(), key)};
  }
  sharded = true;
  std::vector<std::string> out = string_list(f, key);
  for (const auto& n : out) file_name(f, n, key);
  if (out.empty()) f.fail(std::string("field '") + key + "' names no file");
  return out;
}

std::string optional_string(const Fields& f, const char* key) {
  if (!f.j.contains(key) || f.j.at(key).is_null()) return "";
  return f.string(key);
}

}  // namespace

std::string observed_update_file(int rank, int update) {
  return "observed.rank" + std::to_string(rank) + ".u" + std::to_string(update) + ".json";
}

ObservedJob read_observed_job(const std::string& dir, const std::string& nonce) {
  const std::string path = dir + "/observed.json";
  const json j = parse_artifact_json(read_text_file(path), path);
  const Fields top{j, path};
  top.schema("gradcert.observed/1");
  top.nonce(nonce);
  ObservedJob o;
  o.world = static_cast<int>(top.integer("world", 1, 1 << 20));
  o.integration = top.string("integration");
  o.status = top.string("status");
  o.updates_asked = static_cast<int>(top.integer("updates_asked", 1));
  o.updates_done = static_cast<int>(top.integer("updates_done", 0));
  const Fields model{top.at("model"), path + " model"};
  o.model_class = model.string("class");
  o.factory = optional_string(model, "factory");
  o.dtype = model.string("dtype");
  if (o.dtype != "float64" && o.dtype != "float32" && o.dtype != "bfloat16")
    model.fail("field 'dtype' must be float64, float32 or bfloat16, got " + json_excerpt(model.at("dtype")));
  if (!model.null("vocab")) o.vocab = static_cast<int>(model.integer("vocab", 1));
  o.max_len = static_cast<int>(model.integer("max_len", 0));
  o.frozen = string_list(model, "frozen");
  if (model.j.contains("hf")) {
    o.hf = true;
    const Fields hf{model.at("hf"), path + " model.hf"};
    o.hf_loss_type = optional_string(hf, "loss_type");
  }
  if (model.j.contains("rebuild")) {  // NOTE [the job's own module] (gradcert/_job_module.py)
    const Fields rebuild{model.at("rebuild"), path + " model.rebuild"};
    o.rebuild = optional_string(rebuild, "how");
    o.rebuild_error = optional_string(rebuild, "error");
  }
  o.labels = optional_string(top, "labels");
  const json& drop = array_field(top, "dropout_turned_off");
  for (size_t i = 0; i < drop.size(); ++i) {
    const Fields d{drop[i], path + " dropout_turned_off[" + std::to_string(i) + "]"};
    const std::string where = d.string("module") + (d.j.contains("attribute") ? "." + d.string("attribute") : "");
    o.dropout.push_back(where + " p=" + json_excerpt(d.at("p")));
  }
  const Fields opt{top.at("optimizer"), path + " optimizer"};
  o.optimizer_class = opt.string("class");
  o.optimizer_kind = optional_string(opt, "kind");
  o.sharded = top.boolean("sharded");
  o.autocast = string_list(top, "autocast");
  o.job = top.at("job");
  if (!o.job.is_object()) top.fail("field 'job' must be an object, got " + json_excerpt(o.job));
  o.versions = top.at("versions");
  const Fields versions{o.versions, path + " versions"};
  o.python = optional_string(versions, "executable");
  return o;
}

ObservedUpdate read_observed_update(const std::string& dir, int rank, int update, const std::string& nonce) {
  const std::string path = dir + "/" + observed_update_file(rank, update);
  const json j = parse_artifact_json(read_text_file(path), path);
  const Fields top{j, path};
  top.schema("gradcert.observed-rank/1");
  top.nonce(nonce);
  ObservedUpdate o;
  o.rank = static_cast<int>(top.integer("rank", 0));
  if (o.rank != rank)
    top.fail("field 'rank' is " + std::to_string(o.rank) + ", the file is rank " + std::to_string(rank) + "'s");
  o.world = static_cast<int>(top.integer("world", 1, 1 << 20));
  o.update = static_cast<int>(top.integer("update", 0));
  if (o.update != update)
    top.fail("field 'update' is " + std::to_string(o.update) + ", the file is update " + std::to_string(update) + "'s");
  const json& micro = array_field(top, "microsteps");
  if (micro.empty()) top.fail("field 'microsteps' is empty: the rank stepped without a forward");
  for (size_t a = 0; a < micro.size(); ++a) {
    const Fields m{micro[a], path + " microsteps[" + std::to_string(a) + "]"};
    ObservedMicrostep ms;
    if (!m.null("num_items_in_batch")) ms.num_items_in_batch = m.integer("num_items_in_batch", 0, INT64_MAX);
    const json& ex = array_field(m, "examples");
    for (size_t b = 0; b < ex.size(); ++b) {
      const Fields e{ex[b], m.where + " examples[" + std::to_string(b) + "]"};
      ObservedExample x;
      x.key = e.string("key");
      x.tokens = int_list(e, "tokens");
      x.labels = int_list(e, "labels");
      if (x.tokens.empty() || x.labels.size() != x.tokens.size())
        e.fail("tokens (" + std::to_string(x.tokens.size()) + ") and labels (" + std::to_string(x.labels.size()) +
               ") must be non-empty and of one length");
      for (int64_t t : x.tokens)
        if (t < 0) e.fail("token " + std::to_string(t) + " is negative");
      ms.examples.push_back(std::move(x));
    }
    o.microsteps.push_back(std::move(ms));
  }
  o.loss_sum = top.measured("loss_sum");
  o.step_seconds = top.number("step_seconds");
  if (j.contains("record_seconds")) o.record_seconds = top.number("record_seconds");
  if (!top.null("clip")) {
    const Fields c{top.at("clip"), path + " clip"};
    o.clip_max_norm = c.number("max_norm");
    if (!(o.clip_max_norm > 0)) c.fail("field 'max_norm' must be > 0, got " + json_excerpt(c.at("max_norm")));
  }
  bool grads_sharded = false, params_sharded = false;
  o.grads = files_field(top, "grads", grads_sharded);
  o.params = files_field(top, "params", params_sharded);
  if (grads_sharded != params_sharded) top.fail("fields 'grads' and 'params' must both be one file or both lists");
  o.sharded = grads_sharded;
  if (j.contains("replicas")) {
    const json& reps = top.at("replicas");
    if (!reps.is_object()) top.fail("field 'replicas' must be an object, got " + json_excerpt(reps));
    for (const auto& [name, digest] : reps.items()) {
      if (!digest.is_string()) top.fail("field 'replicas." + name.substr(0, 80) + "' must be a string");
      o.replicas[name] = digest.get<std::string>();
    }
  }
  if (j.contains("groups")) {
    o.groups = top.at("groups");
    if (!o.groups.is_array() || o.groups.empty())
      top.fail("field 'groups' must be a non-empty array, got " + json_excerpt(o.groups));
    for (size_t g = 0; g < o.groups.size(); ++g) {
      const Fields gf{o.groups[g], path + " groups[" + std::to_string(g) + "]"};
      (void)string_list(gf, "params");
      (void)gf.number("lr");
    }
  }
  return o;
}

std::vector<ObservedError> read_observed_errors(const std::string& dir, const std::string& kind) {
  std::vector<ObservedError> out;
  const std::regex name(R"(observed\.rank([0-9]{1,7})\.)" + kind + R"(\.json)");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (!std::regex_match(file, m, name)) continue;
    ObservedError err;
    err.rank = std::stoi(m[1].str());
    err.file = e.path().string();
    try {
      const json j = parse_artifact_json(read_text_file(err.file), err.file);
      const Fields f{j, err.file};
      err.update = static_cast<int>(f.integer("update", 0));
      err.error = f.string("error");
      if (j.contains("where")) err.where = f.string("where");
    } catch (const std::exception& x) {
      err.error = std::string("(its error file is unreadable: ") + x.what() + ")";
    }
    out.push_back(std::move(err));
  }
  std::sort(out.begin(), out.end(), [](const ObservedError& a, const ObservedError& b) { return a.rank < b.rank; });
  return out;
}

}  // namespace gradcert
