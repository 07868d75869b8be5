#include "conformance/protocol/artifacts.hpp"

#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/fields.hpp"
#include "conformance/protocol/safetensors.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <limits>
#include <set>
#include <sstream>

namespace gradcert {

using nlohmann::json;

void write_rank_record(const std::string& dir, int rank, int dp_rank, const std::vector<RankUpdateRecord>& updates,
                       const std::string& nonce) {
  json ups = json::array();
  for (const auto& u : updates) {
    ups.push_back({{"update", u.update}, {"consumed", u.consumed}, {"loss_sum", json_number(u.loss_sum)}});
    if (u.valid_targets >= 0) ups.back()["valid_targets"] = u.valid_targets;
    if (!u.replicas.empty()) ups.back()["replicas"] = u.replicas;
  }
  json j = {{"schema", "gradcert.rank/1"}, {"rank", rank}, {"dp_rank", dp_rank}, {"nonce", nonce}, {"updates", ups}};
  write_file_atomic(dir + "/rank" + std::to_string(rank) + ".json", j.dump(1));
}

std::string dataset_json(const std::vector<Sample>& samples) {
  json rows = json::array();
  for (const Sample& s : samples) rows.push_back({{"id", s.id}, {"tokens", s.tokens}, {"labels", s.labels}});
  return json{
      {"schema", "gradcert.dataset/1"}, {"ignore_index", kIgnoreIndex}, {"pad_token", kPadToken}, {"samples", rows}}
      .dump();
}

void write_dataset(const std::string& dir, const std::vector<Sample>& samples) {
  write_file_atomic(dir + "/dataset.json", dataset_json(samples));
}

std::string tensor_file(int update, const char* kind) {
  return "u" + std::to_string(update) + "." + kind + ".safetensors";
}

void write_update_tensors(const std::string& dir, int update, const TensorMap& grads, const TensorMap& params) {
  write_safetensors(dir + "/" + tensor_file(update, "grads"), grads, {{"update", std::to_string(update)}});
  write_safetensors(dir + "/" + tensor_file(update, "params"), params, {{"update", std::to_string(update)}});
}

std::string shard_file(int update, int rank, const char* kind) {
  return "u" + std::to_string(update) + ".rank" + std::to_string(rank) + "." + kind + ".safetensors";
}

void write_placed_file(const std::string& path, const std::vector<ShardPiece>& pieces,
                       std::map<std::string, std::string> metadata) {
  TensorMap stored;
  json placement = json::object();
  for (const ShardPiece& p : pieces) {
    // The stored name: the tensor's, numbered when this rank holds several pieces of it.
    std::string name = p.tensor;
    for (int k = 1; stored.count(name); ++k) name = p.tensor + "#" + std::to_string(k);
    json where = {{"tensor", p.tensor}, {"shape", p.shape}, {"replica", p.replica}};
    if (p.flat_begin >= 0)
      where["flat"] = {p.flat_begin, p.flat_begin + p.data.numel()};
    else
      where["offset"] = p.offset;
    placement[name] = where;
    HostTensor t = p.data;
    t.name = name;
    stored.emplace(name, std::move(t));
  }
  metadata["gradcert.placement"] = placement.dump();
  write_safetensors(path, stored, metadata);
}

void write_rank_shards(const std::string& dir, int update, int rank, const std::vector<ShardPiece>& grads,
                       const std::vector<ShardPiece>& params) {
  for (auto [kind, pieces] : {std::pair{"grads", &grads}, {"params", &params}})
    write_placed_file(dir + "/" + shard_file(update, rank, kind), *pieces, {{"update", std::to_string(update)}});
}

void write_manifest(const std::string& dir, const std::string& backend, int world,
                    const std::vector<ManifestUpdate>& updates, const std::string& nonce, bool shards) {
  json ups = json::array();
  for (const auto& u : updates) {
    ups.push_back({{"update", u.update},
                   {"loss", u.has_loss ? json_number(u.loss) : json(nullptr)},
                   {"valid_targets", u.has_valid_targets ? json(u.valid_targets) : json(nullptr)},
                   {"step_seconds", u.step_seconds}});
    if (!shards) {
      ups.back()["grads"] = tensor_file(u.update, "grads");
      ups.back()["params"] = tensor_file(u.update, "params");
      continue;
    }
    json g = json::array(), p = json::array();
    for (int r = 0; r < world; ++r) {
      g.push_back(shard_file(u.update, r, "grads"));
      p.push_back(shard_file(u.update, r, "params"));
    }
    ups.back()["grads"] = g;
    ups.back()["params"] = p;
  }
  json j = {{"schema", shards ? "gradcert.artifacts/2" : "gradcert.artifacts/1"},
            {"backend", backend},
            {"world", world},
            {"nonce", nonce},
            {"updates", ups}};
  write_file_atomic(dir + "/manifest.json", j.dump(1));
}

namespace {

std::string at_index(const std::string& source, size_t u) { return source + " updates[" + std::to_string(u) + "]"; }

const json& updates_array(const Fields& f, size_t want) {
  const json& ups = f.at("updates");
  if (!ups.is_array()) f.fail("field 'updates' must be an array, got " + json_excerpt(ups));
  if (ups.size() != want) f.fail(std::to_string(ups.size()) + " updates, the plan has " + std::to_string(want));
  return ups;
}

}  // namespace

std::vector<ManifestEntry> parse_manifest_json(const std::string& text, const std::string& source, const Plan& plan,
                                               int world, const std::string& nonce, int first, int count) {
  const json manifest = parse_artifact_json(text, source);
  const Fields top{manifest, source};
  const json& schema = top.at("schema");
  const bool sharded = schema.is_string() && schema.get<std::string>() == "gradcert.artifacts/2";
  if (!sharded) top.schema("gradcert.artifacts/1");
  top.nonce(nonce);
  if (top.integer("world") != world)
    top.fail("field 'world' is " + json_excerpt(manifest.at("world")) + ", the run has " + std::to_string(world));
  const json& ups = updates_array(top, count < 0 ? plan.windows.size() : static_cast<size_t>(count));
  std::vector<ManifestEntry> out(ups.size());
  for (size_t u = 0; u < ups.size(); ++u) {
    const Fields f{ups[u], at_index(source, u)};
    ManifestEntry& e = out[u];
    e.scalars.update = static_cast<int>(f.integer("update"));
    if (e.scalars.update != first + static_cast<int>(u))
      f.fail("update index " + std::to_string(e.scalars.update) + ", expected " + std::to_string(first + u));
    // null: the stack exposes no such figure (NOTE [stack figures]); absent stays an error.
    e.scalars.has_loss = !f.null("loss");
    if (e.scalars.has_loss) e.scalars.loss = f.measured("loss");
    e.scalars.has_valid_targets = !f.null("valid_targets");
    if (e.scalars.has_valid_targets) e.scalars.valid_targets = f.integer("valid_targets", 0, INT64_MAX);
    e.scalars.step_seconds = f.number("step_seconds");
    auto file_name = [&](const char* key, const std::string& name) {
      if (name.empty() || name.find('/') != std::string::npos || name.find("..") != std::string::npos)
        f.fail(std::string("field '") + key + "' must name files inside the run directory, got " + json_excerpt(name));
    };
    e.sharded = sharded;
    if (!sharded) {
      for (auto [key, target] : {std::pair{"grads", &e.grads}, {"params", &e.params}}) {
        *target = f.string(key);
        file_name(key, *target);
      }
      continue;
    }
    // Schema 2 (NOTE [shard artifacts]): a list of shard files per kind, each named once.
    for (auto [key, target] : {std::pair{"grads", &e.grad_shards}, {"params", &e.param_shards}}) {
      const json& list = f.at(key);
      if (!list.is_array() || list.empty())
        f.fail(std::string("field '") + key + "' must be a non-empty array of shard file names (schema 2), got " +
               json_excerpt(list));
      if (list.size() > static_cast<size_t>(world))  // a rank writes one shard file per kind
        f.fail(std::string("field '") + key + "' lists " + std::to_string(list.size()) + " shard files for " +
               std::to_string(world) + " ranks (at most one per rank): " + json_excerpt(list[world]) +
               " is one too many");
      std::set<std::string> seen;
      for (const json& v : list) {
        if (!v.is_string()) f.fail(std::string("field '") + key + "' holds a non-string: " + json_excerpt(v));
        file_name(key, v.get<std::string>());
        if (!seen.insert(v.get<std::string>()).second)
          f.fail(std::string("field '") + key + "' names file '" + v.get<std::string>() + "' twice");
        target->push_back(v.get<std::string>());
      }
    }
  }
  return out;
}

std::vector<RankRecord> parse_rank_record_json(const std::string& text, const std::string& source, const Plan& plan,
                                               int rank, const std::string& nonce, int first, int count) {
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
  const json& ups = updates_array(top, count < 0 ? plan.windows.size() : static_cast<size_t>(count));
  std::vector<RankRecord> out;
  for (size_t u = 0; u < ups.size(); ++u) {
    const Fields f{ups[u], at_index(source, u)};
    if (f.integer("update") != first + static_cast<int64_t>(u))
      f.fail("field 'update' is " + json_excerpt(ups[u].at("update")) + ", expected " + std::to_string(first + u));
    RankRecord rr;
    if (ups[u].contains("loss_sum")) rr.loss_sum = f.measured("loss_sum"), rr.has_loss_sum = true;
    if (ups[u].contains("valid_targets")) rr.valid_targets = f.integer("valid_targets", 0, INT64_MAX);
    if (ups[u].contains("replicas")) {  // NOTE [replica digests]
      const json& reps = ups[u].at("replicas");
      if (!reps.is_object())
        f.fail("field 'replicas' must be an object of tensor name -> digest, got " + json_excerpt(reps));
      for (const auto& [name, digest] : reps.items()) {
        if (name.empty() || !digest.is_string() || digest.get<std::string>().empty() ||
            digest.get<std::string>().size() > 128)
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
      if (!consumed[a].is_array())
        f.fail("field '" + at + "' must be an array of sample ids, got " + json_excerpt(consumed[a]));
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

namespace {

// One replica group of one update's shard files, assembled (NOTE [shard artifacts]).
struct ReplicaGroup {
  TensorMap tensors;  // every expected tensor, streamed from its pieces
  std::string files;  // the files that hold its pieces, comma-separated
};
using Replicas = std::map<int, ReplicaGroup>;

std::vector<int64_t> int_array(const Fields& f, const char* key, size_t want_size) {
  const json& v = f.at(key);
  if (!v.is_array() || v.size() != want_size)
    f.fail(std::string("field '") + key + "' must be an array of " + std::to_string(want_size) + " integers, got " +
           json_excerpt(v));
  std::vector<int64_t> out;
  for (const json& x : v) {
    if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX)))
      f.fail(std::string("field '") + key + "' holds a non-integer or out-of-range value: " + json_excerpt(x));
    out.push_back(x.get<int64_t>());
  }
  return out;
}

// A placed piece: its values, where it lies as row-major intervals, and its file.
struct Placed {
  TensorPiece piece;
  std::vector<std::pair<int64_t, int64_t>> intervals;
  std::string file;
};

// The row-major intervals of a box of extent t.shape at offset `at` in a tensor of `shape`.
void box_intervals(const HostTensor& t, const std::vector<int64_t>& shape, const std::vector<int64_t>& at,
                   std::vector<std::pair<int64_t, int64_t>>& out) {
  if (t.numel() == 0) return;
  const size_t dims = shape.size();
  const int64_t row = dims ? t.shape[dims - 1] : 1;
  std::vector<int64_t> idx(dims, 0);
  for (int64_t done = 0; done < t.numel(); done += row) {
    int64_t fl = 0;
    for (size_t d = 0; d < dims; ++d) fl = fl * shape[d] + at[d] + idx[d];
    out.push_back({fl, fl + row});
    for (size_t d = dims - 1; dims > 1 && d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// A stored piece t of a tensor of `shape`, placed by its entry: 'flat' ([begin, end) of the
// row-major tensor, stored 1-D) or 'offset' (a box of t's extent, stored with the tensor's rank).
Placed place_piece(const Fields& f, const json& entry, const HostTensor& t, const std::vector<int64_t>& shape,
                   const std::string& file) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  Placed p;
  p.piece = t.source->pieces.at(0);
  p.file = file;
  const bool flat = entry.contains("flat"), box = entry.contains("offset");
  if (flat == box) f.fail("give exactly one of 'flat' ([begin, end) of the row-major tensor) and 'offset'");
  if (flat) {
    const auto be = int_array(f, "flat", 2);
    if (be[0] < 0 || be[0] > be[1] || be[1] > numel)
      f.fail("'flat' [" + std::to_string(be[0]) + ", " + std::to_string(be[1]) + ") is not a range of the " +
             std::to_string(numel) + " elements");
    if (t.shape != std::vector<int64_t>{be[1] - be[0]})
      f.fail("a 'flat' piece is stored 1-D with " + std::to_string(be[1] - be[0]) + " elements");
    p.piece.flat_begin = be[0];
    if (be[1] > be[0]) p.intervals.push_back({be[0], be[1]});
    return p;
  }
  const auto at = int_array(f, "offset", shape.size());
  if (t.shape.size() != shape.size()) f.fail("a box piece is stored with the tensor's number of dimensions");
  for (size_t d = 0; d < shape.size(); ++d)
    if (at[d] < 0 || at[d] + t.shape[d] > shape[d])
      f.fail("the box of extent " + std::to_string(t.shape[d]) + " at offset " + std::to_string(at[d]) +
             " leaves dimension " + std::to_string(d) + " (" + std::to_string(shape[d]) + ")");
  p.piece.at = at;
  p.piece.box = t.shape;
  box_intervals(t, shape, at, p.intervals);
  return p;
}

// One replica's tensor from its pieces (null: none), every element held exactly once; `in`
// names the replica and tensor in errors, `files` the replica's files.
HostTensor assemble_tensor(const std::string& in, const std::string& tensor, const TensorExpectation& want,
                           const std::vector<Placed>* pieces, const std::string& files) {
  int64_t numel = 1;
  for (int64_t d : want.shape) numel *= d;
  std::vector<std::pair<std::pair<int64_t, int64_t>, const Placed*>> iv;
  if (pieces)
    for (const Placed& p : *pieces)
      for (const auto& x : p.intervals) iv.push_back({x, &p});
  std::sort(iv.begin(), iv.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  int64_t covered = 0;
  const Placed* last = nullptr;
  for (const auto& [x, p] : iv) {
    if (x.first < covered)
      throw ArtifactError(in + ": elements [" + std::to_string(x.first) + ", " +
                          std::to_string(std::min(x.second, covered)) + ") are held twice (" + last->file + " and " +
                          p->file + ")");
    if (x.first > covered)
      throw ArtifactError(in + ": elements [" + std::to_string(covered) + ", " + std::to_string(x.first) + ") of " +
                          std::to_string(numel) + " are in no shard (files of the group: " + files + ")");
    covered = x.second;
    last = p;
  }
  if (covered < numel)
    throw ArtifactError(in + ": elements [" + std::to_string(covered) + ", " + std::to_string(numel) + ") of " +
                        std::to_string(numel) + " are in no shard (files of the group: " + files + ")");
  HostTensor t;
  t.name = tensor;
  t.shape = want.shape;
  t.dtype = want.dtype;
  auto src = std::make_shared<TensorSource>();
  if (pieces)
    for (const Placed& p : *pieces) src->pieces.push_back(p.piece);
  if (numel == 0)
    t.held = {};  // nothing to read
  else
    t.source = std::move(src);
  return t;
}

Replicas read_shards(const std::string& dir, const std::vector<std::string>& files,
                     const std::map<std::string, TensorExpectation>& expect, const std::string& what) {
  uint64_t model_bytes = 0;  // the cap of one file: one whole copy of the model (NOTE [artifact files])
  for (const auto& kv : expect) {
    uint64_t b = static_cast<uint64_t>(dtype_bytes(kv.second.dtype));
    for (int64_t d : kv.second.shape) b *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
    model_bytes += b;
  }
  std::map<std::pair<std::string, int>, std::vector<Placed>> by_tensor;  // (tensor, replica) -> pieces
  std::map<int, std::set<std::string>> files_of;                         // replica -> its files
  for (const std::string& file : files) {
    const std::string path = dir + "/" + file;
    std::map<std::string, std::string> meta;
    const TensorMap stored = open_safetensors(path, model_bytes, meta);
    if (stored.empty()) continue;  // a rank that holds nothing of this kind
    auto m = meta.find("gradcert.placement");
    if (m == meta.end())
      throw ArtifactError(path +
                          ": no \"gradcert.placement\" metadata entry (a shard file says where each tensor lies)");
    const json placement = parse_artifact_json(m->second, path + " \"gradcert.placement\"");
    if (!placement.is_object()) throw ArtifactError(path + ": \"gradcert.placement\" is not a JSON object");
    for (const auto& [key, value] : placement.items())
      if (!stored.count(key))
        throw ArtifactError(path + ": \"gradcert.placement\" places tensor '" + key +
                            "', which the file does not hold");
    for (const auto& [name, t] : stored) {
      if (!placement.contains(name))
        throw ArtifactError(path + ": tensor '" + name + "' has no entry in \"gradcert.placement\"");
      const Fields f{placement.at(name), path + " placement of '" + name + "'"};
      const std::string tensor = f.string("tensor");
      auto e = expect.find(tensor);
      if (e == expect.end()) f.fail("tensor '" + tensor + "' is not a parameter of the model");
      const std::vector<int64_t>& shape = e->second.shape;
      if (int_array(f, "shape", shape.size()) != shape) f.fail("field 'shape' is not tensor '" + tensor + "''s shape");
      if (t.dtype != e->second.dtype)
        f.fail("dtype " + dtype_name(t.dtype) + " but the plan expects " + dtype_name(e->second.dtype));
      const int replica = static_cast<int>(f.integer("replica", 0, 1 << 20));
      Placed p = place_piece(f, placement.at(name), t, shape, file);
      files_of[replica].insert(file);
      by_tensor[{tensor, replica}].push_back(std::move(p));
    }
  }
  if (files_of.empty()) throw ArtifactError(dir + ": " + what + ": the shard files hold no tensor");
  Replicas out;
  for (const auto& [r, names] : files_of) {
    ReplicaGroup& g = out[r];
    for (const std::string& f : names) g.files += (g.files.empty() ? "" : ", ") + f;
    for (const auto& [tensor, want] : expect) {
      const std::string in = dir + ": " + what + ": replica " + std::to_string(r) + ": tensor '" + tensor + "'";
      auto it = by_tensor.find({tensor, r});
      g.tensors.emplace(tensor,
                        assemble_tensor(in, tensor, want, it == by_tensor.end() ? nullptr : &it->second, g.files));
    }
  }
  return out;
}

}  // namespace

TensorMap artifact_shapes(const std::string& dir) {
  const std::string mpath = dir + "/manifest.json";
  const json m = parse_artifact_json(read_text_file(mpath), mpath);
  const Fields top{m, mpath};
  const json& ups = top.at("updates");
  if (!ups.is_array() || ups.empty()) top.fail("field 'updates' must be a non-empty array");
  const Fields first{ups[0], at_index(mpath, 0)};
  const json& params = first.at("params");
  if (params.is_string()) {
    TensorMap t = read_safetensors(dir + "/" + params.get<std::string>());
    for (auto& kv : t) kv.second.source.reset();  // names, shapes and dtypes only
    return t;
  }
  if (!params.is_array()) first.fail("field 'params' must be a file name or a list of shard files");
  TensorMap out;
  for (const json& f : params) {
    if (!f.is_string()) first.fail("field 'params' holds a non-string: " + json_excerpt(f));
    const std::string name = f.get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name.find("..") != std::string::npos)
      first.fail("field 'params' must name files inside the run directory, got " + json_excerpt(name));
    std::map<std::string, std::string> meta;
    const TensorMap stored = open_safetensors(dir + "/" + name, std::numeric_limits<uint64_t>::max() / 2, meta);
    if (stored.empty() || !meta.count("gradcert.placement")) continue;
    const json placement =
        parse_artifact_json(meta["gradcert.placement"], dir + "/" + name + " \"gradcert.placement\"");
    for (const auto& [key, t] : stored) {
      if (!placement.is_object() || !placement.contains(key)) continue;  // read_run names the problem
      const Fields pl{placement.at(key), dir + "/" + name + " placement of '" + key + "'"};
      HostTensor h;
      h.name = pl.string("tensor");
      const json& shape = pl.at("shape");
      if (!shape.is_array()) pl.fail("field 'shape' must be an array");
      h.shape = int_array(pl, "shape", shape.size());
      h.dtype = t.dtype;
      out.emplace(h.name, std::move(h));
    }
  }
  return out;
}

// A record <prefix>rank<g>.json of a rank the run did not have (g >= world): the run folder is
// emptied at the start of every run, so this run's stack wrote it from a world that is not the run's.
static void refuse_stray_rank_records(const std::string& dir, const std::string& prefix, int world) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string head = prefix + "rank", tail = ".json";
    if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (digits.size() > 9 || std::stoi(digits) >= world)
      throw ArtifactError(dir + "/" + name + ": a record of rank " + digits + ", but the run's world is " +
                          std::to_string(world) + " (ranks 0.." + std::to_string(world - 1) +
                          "): the stack ran more ranks than the run started");
  }
}

std::map<int, TensorMap> read_placed(const std::string& dir, const std::vector<std::string>& files,
                                     const std::map<std::string, TensorExpectation>& expect, const std::string& what) {
  std::map<int, TensorMap> out;
  for (auto& [replica, group] : read_shards(dir, files, expect, what)) out.emplace(replica, std::move(group.tensors));
  return out;
}

std::vector<BackendUpdate> read_run(const std::string& dir, const Plan& plan, int world, const TensorMap& expected,
                                    DType dtype, const std::string& nonce, const RunLeg& leg) {
  std::map<std::string, TensorExpectation> expect;
  for (const auto& [name, t] : expected) expect[name] = {t.shape, dtype};
  // Reads stay inside the run folder (NOTE [artifact files]) only while it is one.
  std::error_code ec;
  if (!std::filesystem::is_directory(std::filesystem::symlink_status(dir, ec)))
    throw ArtifactError(dir + ": the run folder is no longer a folder (replaced by a symbolic link?)");

  const std::string mpath = dir + "/" + leg.prefix + "manifest.json";
  const auto entries = parse_manifest_json(read_text_file(mpath), mpath, plan, world, nonce, leg.first, leg.count);
  std::vector<BackendUpdate> run(entries.size());
  for (size_t u = 0; u < entries.size(); ++u) {
    auto& bu = run[u];
    bu.update = entries[u].scalars.update;
    bu.loss = entries[u].scalars.loss;
    bu.valid_targets = entries[u].scalars.valid_targets;
    bu.has_loss = entries[u].scalars.has_loss;
    bu.has_valid_targets = entries[u].scalars.has_valid_targets;
    bu.step_seconds = entries[u].scalars.step_seconds;
    if (!entries[u].sharded) {
      bu.grads = read_safetensors(dir + "/" + entries[u].grads, expect);
      bu.params_after = read_safetensors(dir + "/" + entries[u].params, expect);
      continue;
    }
    const std::string at = "update " + std::to_string(bu.update);
    Replicas g = read_shards(dir, entries[u].grad_shards, expect, at + " gradients");
    Replicas p = read_shards(dir, entries[u].param_shards, expect, at + " parameters");
    if (g.begin()->first != p.begin()->first)
      throw ArtifactError(mpath + ": " + at + ": the lowest replica group of the gradients (" +
                          std::to_string(g.begin()->first) + ") is not that of the parameters (" +
                          std::to_string(p.begin()->first) + ")");
    bu.grads = std::move(g.begin()->second.tensors);
    bu.params_after = std::move(p.begin()->second.tensors);
    for (auto it = std::next(g.begin()); it != g.end(); ++it) {
      ReplicaCopy c;
      c.replica = it->first;
      c.files = it->second.files;
      c.grads = std::move(it->second.tensors);
      if (auto q = p.find(it->first); q != p.end()) {
        c.params_after = std::move(q->second.tensors);
        if (q->second.files != c.files) c.files += "; " + q->second.files;
      }
      bu.other_replicas.push_back(std::move(c));
    }
    for (auto it = std::next(p.begin()); it != p.end(); ++it)
      if (!g.count(it->first)) {
        ReplicaCopy c;
        c.replica = it->first;
        c.files = it->second.files;
        c.params_after = std::move(it->second.tensors);
        bu.other_replicas.push_back(std::move(c));
      }
  }
  refuse_stray_rank_records(dir, leg.prefix, world);
  for (int r = 0; r < world; ++r) {
    const std::string rpath = dir + "/" + leg.prefix + "rank" + std::to_string(r) + ".json";
    auto records = parse_rank_record_json(read_text_file(rpath), rpath, plan, r, nonce, leg.first, leg.count);
    for (size_t u = 0; u < records.size(); ++u) run[u].ranks.push_back(std::move(records[u]));
  }
  return run;
}

}  // namespace gradcert
