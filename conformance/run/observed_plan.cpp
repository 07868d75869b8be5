// NOTE [observed plan] A `gradcert observe` run folder is a run folder like any other (the
// checks, the Python reference and the diagnosis read it as they read an external stack's), but
// its inputs are what the job did, not what a spec made:
//   - the dataset: every example any rank's forward received in the K updates, numbered by first
//     appearance (update, rank, microstep, row); an example's identity is its content key, so a
//     sampler that hands one example to two ranks, or twice in an epoch, is a ledger finding
//     (and two identical rows of the user's data are one example: the limit of content keys);
//   - the plan: D = the job's world (every rank a data-parallel replica), A = the most forwards
//     a rank ran between two optimizer steps, B_micro = the most rows of one forward; slots[r][a]
//     = rank r's a-th forward of the update. B_update, the figure batch.update_size holds the
//     job to, is --expect-batch, else the job's own settings as its integration read them (HF:
//     per_device_train_batch_size x gradient_accumulation_steps x world), else B_micro x A x D
//     (then only the consistency of the updates is checked, and the report says so);
//   - epochs: from the job's dataset size where the integration saw it (the window that ends an
//     epoch is partial, judged against its own size); else no epoch is known to end in the K
//     updates and the ledger checks only that no example came twice;
//   - N: the job's num_items_in_batch (rank 0's first forward of the window) where the job
//     passed one, else none (targets.window_count skips: the job's N is not visible);
//   - the optimizer: every param group as each step used it (lr from the schedule, momentum,
//     betas, eps, weight decay), the rule from the optimizer's class (SGD, Adam, AdamW), and the
//     clip from the job's clip_grad_norm_; frozen parameters from requires_grad.
// The stack's tensors are the job's own files; the loss is null (the job's loss is its own
// business: gradients are compared), each rank's loss_sum is gradcert's on the job's logits.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "conformance/core/dataset.hpp"
#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/protocol/artifacts.hpp"
#include "conformance/protocol/run_folder.hpp"
#include "conformance/run/observe.hpp"

namespace gradcert {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

int64_t job_integer(const json& job, const char* key) {
  auto it = job.find(key);
  if (it == job.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return 0;
  return it->get<int64_t>();
}

double number_or(const json& g, const char* key, double fallback) {
  auto it = g.find(key);
  return it != g.end() && it->is_number() ? it->get<double>() : fallback;
}

bool flag(const json& g, const char* key) {
  auto it = g.find(key);
  return it != g.end() && it->is_boolean() && it->get<bool>();
}

// One torch param group as gradcert's reference steps it ({params, name, lr, momentum,
// weight_decay, beta1, beta2, eps}); sets `unsupported` to why the reference cannot step it.
json reference_group(const json& g, const std::string& kind, const std::string& cls, std::string& unsupported) {
  json out = {{"params", g.at("params")},
              {"lr", g.at("lr").get<double>()},
              {"weight_decay", number_or(g, "weight_decay", 0)},
              {"momentum", 0.0},
              {"beta1", 0.9},
              {"beta2", 0.999},
              {"eps", 1e-8}};
  auto refuse = [&](const std::string& why) {
    if (unsupported.empty()) unsupported = cls + " with " + why;
  };
  if (flag(g, "maximize")) refuse("maximize=True");
  if (kind == "sgd") {
    out["name"] = "sgd";
    out["momentum"] = number_or(g, "momentum", 0);
    if (number_or(g, "dampening", 0) != 0) refuse("dampening != 0");
    if (flag(g, "nesterov")) refuse("nesterov=True");
  } else if (kind == "adam" || kind == "adamw") {
    out["name"] = kind == "adam" && !flag(g, "decoupled_weight_decay") ? "adam" : "adamw";
    if (auto b = g.find("betas");
        b != g.end() && b->is_array() && b->size() == 2 && (*b)[0].is_number() && (*b)[1].is_number()) {
      out["beta1"] = (*b)[0].get<double>();
      out["beta2"] = (*b)[1].get<double>();
    }
    out["eps"] = number_or(g, "eps", 1e-8);
    if (flag(g, "amsgrad")) refuse("amsgrad=True");
  } else {
    out["name"] = "sgd";
    out["lr"] = 0.0;
    refuse("its own update rule");
  }
  return out;
}

// NOTE [observing cost] What recording cost the job, paired per update in this run: the slowest
// rank's step with the recording (hooks, copies, files: record_seconds) over the slowest rank's
// step without it (step_seconds), the median over the observed updates. Update 0 counts from
// watch() to the first step. "" when a rank did not time its recording.
std::string observing_cost(const std::vector<std::vector<ObservedUpdate>>& rec) {
  std::vector<double> ratios;
  for (const auto& ranks : rec) {
    double with = 0, without = 0;
    for (const auto& r : ranks) {
      if (r.record_seconds < 0) return "";
      with = std::max(with, r.step_seconds + r.record_seconds);
      without = std::max(without, r.step_seconds);
    }
    if (without > 0) ratios.push_back(with / without);
  }
  if (ratios.empty()) return "";
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  const double median = n % 2 ? ratios[n / 2] : (ratios[n / 2 - 1] + ratios[n / 2]) / 2;
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2f", median);
  return "; observing cost: the job's step took " + std::string(ratio) +
         "x its time without the recording (median of " + std::to_string(n) + " updates, NOTE [observing cost])";
}

std::string range_text(int n) { return n == 1 ? "update 0" : "updates 0.." + std::to_string(n - 1); }

using Records = ObservedRecords;

// Every rank's record of each of the K updates, one world and one sharding throughout.
Records read_records(const std::string& dir, const ObservedJob& job, int K, const std::string& nonce) {
  const int W = job.world;
  Records rec(K);
  for (int u = 0; u < K; ++u)
    for (int g = 0; g < W; ++g) {
      rec[u].push_back(read_observed_update(dir, g, u, nonce));
      if (rec[u].back().world != W)
        throw std::invalid_argument(
            "rank " + std::to_string(g) + ", update " + std::to_string(u) + ": the job's world is " +
            std::to_string(rec[u].back().world) + " there, " + std::to_string(W) +
            " when it started (the world changed mid-run): gradcert observe certifies one world");
      if (rec[u].back().sharded != job.sharded)
        throw std::invalid_argument(observed_update_file(g, u) + ": its tensors are " +
                                    (job.sharded ? "whole" : "pieces") + ", observed.json says the model is " +
                                    (job.sharded ? "sharded" : "not sharded"));
    }
  for (int u = 0; u < K; ++u)
    if (!rec[u][0].groups.is_array())
      throw ArtifactError(dir + "/" + observed_update_file(0, u) +
                          ": field 'groups' is missing (rank 0 records the param groups)");
  return rec;
}

// What the records make as they are read, beside the folder's parts (ObservedFolder).
struct Assembly {
  std::map<std::string, int64_t> id_of;  // content key -> example id
  std::vector<int64_t> targets_of_id;
  size_t longest = 0;
  json groups_per_update = json::array();
  double clip = 0;
  std::string batch_source;
  bool epoch_known = false;
  int64_t job_dataset = 0;
};

// An example's id: numbered by first appearance (NOTE [observed plan]).
int64_t example_id(Assembly& a, ObservedFolder& out, const ObservedExample& e) {
  auto [it, fresh] = a.id_of.emplace(e.key, static_cast<int64_t>(a.targets_of_id.size()));
  if (fresh) {
    Sample sample;
    sample.id = it->second;
    sample.tokens = e.tokens;
    sample.labels = e.labels;
    out.samples.push_back(std::move(sample));
    std::string first;
    for (size_t t = 0; t < e.tokens.size() && t < 6; ++t) first += (t ? " " : "") + std::to_string(e.tokens[t]);
    out.observed.example_names[it->second] =
        "content " + e.key + ", tokens " + first + (e.tokens.size() > 6 ? " ..." : "");
    a.targets_of_id.push_back(
        std::count_if(e.labels.begin(), e.labels.end(), [](int64_t l) { return l != kIgnoreIndex; }));
    a.longest = std::max(a.longest, e.tokens.size());
  }
  return it->second;
}

// The plan's shape: D, A, B_micro, B_update (and where it came from), the epoch's windows.
Plan plan_shape(const ObserveRequest& req, const ObservedJob& job, const Records& rec, Assembly& a) {
  const int K = req.updates, W = job.world;
  Plan plan;
  plan.dp = W;
  plan.accum = plan.micro = 1;
  for (int u = 0; u < K; ++u)
    for (const auto& r : rec[u]) {
      plan.accum = std::max<int>(plan.accum, static_cast<int>(r.microsteps.size()));
      for (const auto& m : r.microsteps) plan.micro = std::max<int>(plan.micro, static_cast<int>(m.examples.size()));
    }
  if (req.expect_batch > 0) {
    plan.update_batch = req.expect_batch;
    a.batch_source = "--expect-batch " + std::to_string(req.expect_batch);
  } else if (const int64_t b = job_integer(job.job, "expect_batch"); b > 0) {
    plan.update_batch = b;
    const auto src = job.job.find("source");
    a.batch_source = "the job's own settings" +
                     (src != job.job.end() && src->is_string() ? " (" + src->get<std::string>() + ")" : std::string());
  } else {
    plan.update_batch = update_batch_size(plan.micro, plan.accum, W);
    a.batch_source = "what the job did (B_micro x A x D = " + std::to_string(plan.micro) + " x " +
                     std::to_string(plan.accum) + " x " + std::to_string(W) +
                     "; pass --expect-batch B to hold it to a figure)";
  }
  a.job_dataset = job_integer(job.job, "dataset_size");
  const bool drop_last = flag(job.job, "drop_last");
  const int64_t job_windows = job_integer(job.job, "windows_per_epoch");  // the job's loader length / A, where seen
  const int64_t B = plan.update_batch;
  plan.windows_per_epoch = job_windows > 0     ? static_cast<int>(job_windows)
                           : a.job_dataset > 0 ? static_cast<int>(drop_last ? std::max<int64_t>(1, a.job_dataset / B)
                                                                            : (a.job_dataset + B - 1) / B)
                                               : K + 1;
  a.epoch_known = job_windows > 0 || a.job_dataset > 0;
  return plan;
}

// Update u's window (slots[r][a]: rank r's a-th forward) and each rank's record of it; the one
// clip_grad_norm_ max_norm the job used.
Window observed_window(int u, const std::vector<ObservedUpdate>& ranks, const Plan& plan, Assembly& a,
                       ObservedFolder& out) {
  const int W = plan.dp, A = plan.accum;
  Window w;
  w.update = u;
  w.epoch = u / plan.windows_per_epoch;
  w.index_in_epoch = u % plan.windows_per_epoch;
  w.slots.assign(W, std::vector<Microbatch>(A));
  for (int g = 0; g < W; ++g) {
    const ObservedUpdate& r = ranks[g];
    RankUpdateRecord record;  // the rank's N is left out: only the job's own N is evidence
    record.update = u;
    record.loss_sum = r.loss_sum;
    record.replicas = r.replicas;
    record.valid_targets = -1;
    for (int k = 0; k < A; ++k) {
      Microbatch& mb = w.slots[g][k];
      if (k < static_cast<int>(r.microsteps.size()))
        for (const auto& e : r.microsteps[k].examples) {
          const int64_t id = example_id(a, out, e);
          mb.ids.push_back(id);
          mb.input_tokens += static_cast<int64_t>(e.tokens.size());
          mb.valid_targets += a.targets_of_id[id];
        }
      w.ids.insert(w.ids.end(), mb.ids.begin(), mb.ids.end());
      w.valid_targets += mb.valid_targets;
      record.consumed.push_back(mb.ids);
    }
    out.ranks[g].push_back(std::move(record));
    if (r.clip_max_norm > 0) {
      if (a.clip > 0 && r.clip_max_norm != a.clip)
        throw std::invalid_argument("rank " + std::to_string(g) + ", update " + std::to_string(u) +
                                    ": clip_grad_norm_ max_norm " + figure_text(r.clip_max_norm) + ", earlier " +
                                    figure_text(a.clip) + ": gradcert observe certifies one max_norm");
      a.clip = r.clip_max_norm;
    }
  }
  // The window that ends an epoch is partial when it held fewer examples than B_update
  // (batch.update_size then holds it to its own size; a padded one is the ledger's finding).
  w.partial = a.epoch_known && w.index_in_epoch == plan.windows_per_epoch - 1 &&
              static_cast<int64_t>(w.ids.size()) < plan.update_batch;
  return w;
}

// The job's tensor files must be the protocol's names for update u (the manifest writer names them).
void expect_protocol_files(int u, const std::vector<ObservedUpdate>& ranks, bool sharded) {
  for (size_t g = 0; g < ranks.size(); ++g) {
    const ObservedUpdate& r = ranks[g];
    for (auto [kind, files] : {std::pair{"grads", &r.grads}, {"params", &r.params}}) {
      const std::string want = sharded ? shard_file(u, static_cast<int>(g), kind) : tensor_file(u, kind);
      if ((sharded || g == 0) && (files->size() != 1 || files->front() != want))
        throw ArtifactError(observed_update_file(static_cast<int>(g), u) + ": field '" + kind + "' names " +
                            (files->empty() ? std::string("no file") : files->front()) + ", the protocol's file is " +
                            want);
    }
  }
}

// Update u in manifest.json: rank 0's N (the job's num_items_in_batch, else null) and step time.
ManifestUpdate manifest_update(int u, const std::vector<ObservedUpdate>& ranks, bool sharded) {
  expect_protocol_files(u, ranks, sharded);
  const ObservedUpdate& r0 = ranks[0];
  const int64_t n_items = r0.microsteps.front().num_items_in_batch;
  ManifestUpdate m;
  m.update = u;
  m.has_loss = false;  // the job's loss is its own business: gradients are compared
  m.has_valid_targets = n_items >= 0;
  m.valid_targets = std::max<int64_t>(n_items, 0);
  m.step_seconds = r0.step_seconds;
  return m;
}

// The model the reference rebuilds: --model, the job's factory, or its own module (observed_model.py);
// returns where it came from.
std::string observed_model(const ObserveRequest& req, const ObservedJob& job, Spec& spec) {
  spec.model.factory = req.model;
  if (!spec.model.factory.empty()) return "--model " + req.model;
  if (!job.factory.empty()) {
    spec.model.factory = job.factory;
    return "gradcert.watch(factory=" + job.factory + ")";
  }
  if (!job.rebuild.empty()) {
    spec.model.factory = fs::absolute(req.run_dir + "/observed_model.py").string() + ":build";
    return job.rebuild;
  }
  throw std::invalid_argument("gradcert cannot rebuild the job's model " + job.model_class + " for the reference" +
                              (job.rebuild_error.empty()
                                   ? std::string(": it is not a Hugging Face PreTrainedModel")
                                   : ": pickling the job's module at watch() failed: " + job.rebuild_error) +
                              ". Pass gradcert.watch(model, optimizer, factory=FUNC), FUNC(vocab_size, max_len) -> the "
                              "model (or --model FILE.py:FUNC)");
}

// The spec the reference and the report read; returns where the model came from.
std::string observed_spec(const ObserveRequest& req, const ObservedJob& job, const Plan& plan, const Assembly& a,
                          ObservedRun& out) {
  Spec& spec = out.run.spec;
  if (job.vocab <= 0)
    throw std::invalid_argument("observed.json: the integration saw no forward's logits (model.vocab is null)");
  spec.model.vocab = job.vocab;
  spec.model.max_len = std::max<int>(job.max_len, static_cast<int>(a.longest));
  const std::string model_source = observed_model(req, job, spec);
  spec.dataset.size = static_cast<int>(std::max<int64_t>(a.job_dataset, static_cast<int64_t>(a.targets_of_id.size())));
  spec.batch.micro = plan.micro;
  spec.batch.accum = plan.accum;
  spec.topology = {job.world, 1, 1};
  spec.updates = req.updates;
  spec.dtype = parse_dtype(job.dtype);
  for (const auto& ac : job.autocast)  // lower-precision compute inside: that dtype's calibrated tolerance
    if (ac.find("bfloat16") != std::string::npos || ac.find("float16") != std::string::npos) {
      spec.tolerance.float32 = spec.tolerance.float64 = spec.tolerance.bfloat16;
      spec.tolerance.scale_float32 = spec.tolerance.scale_float64 = spec.tolerance.scale_bfloat16;
      out.notes += "autocast " + ac + ": held to bfloat16's calibrated tolerances; ";
    }
  const json& g0 = a.groups_per_update[0][0];
  spec.optimizer.name = g0["name"] == "sgd" ? "sgd" : "adamw";
  spec.optimizer.lr = g0["lr"].get<double>();
  spec.optimizer.momentum = g0["momentum"].get<double>();
  spec.optimizer.weight_decay = g0["weight_decay"].get<double>();
  spec.optimizer.beta1 = g0["beta1"].get<double>();
  spec.optimizer.beta2 = g0["beta2"].get<double>();
  spec.optimizer.eps = g0["eps"].get<double>();
  spec.optimizer.max_grad_norm = a.clip;
  return model_source;
}

// What the report says about the job.
std::string job_facts(const ObservedJob& job, const RunPlan& run, const Assembly& a, const std::string& model_source,
                      const Records& rec) {
  std::string facts = "observed " + range_text(static_cast<int>(rec.size())) + " of `" + run.request.command +
                      "` through " + job.integration + " (world " + std::to_string(job.world) + ", " + job.model_class +
                      ", " + job.dtype + "); B_update from " + a.batch_source +
                      "; the reference rebuilt the model from " + model_source + "; optimizer " + job.optimizer_class +
                      (a.clip > 0 ? ", clip_grad_norm_ max_norm " + figure_text(a.clip) : std::string()) + "; labels " +
                      (job.labels.empty() ? "?" : job.labels) +
                      (job.hf_loss_type.empty() ? std::string() : " (HF loss_type " + job.hf_loss_type + ")");
  if (!job.frozen.empty()) facts += "; " + std::to_string(job.frozen.size()) + " frozen tensors held unchanged";
  if (!job.dropout.empty()) {
    facts += "; dropout turned off for the observed updates in";
    for (size_t i = 0; i < job.dropout.size() && i < 6; ++i) facts += (i ? ", " : " ") + job.dropout[i];
    if (job.dropout.size() > 6) facts += " and " + std::to_string(job.dropout.size() - 6) + " more";
  }
  if (!a.epoch_known) facts += "; no epoch end known (the integration saw no dataset size)";
  return facts + observing_cost(rec);
}

}  // namespace

ObservedFolder observed_folder(const ObserveRequest& req, const ObservedJob& job, const ObservedRecords& rec) {
  const int K = static_cast<int>(rec.size()), W = job.world;
  ObservedFolder out;
  ObservedRun& obs = out.observed;
  Assembly a;
  out.ranks.assign(W, {});
  Plan plan = plan_shape(req, job, rec, a);
  for (int u = 0; u < K; ++u) {
    plan.windows.push_back(observed_window(u, rec[u], plan, a, out));
    out.manifest.push_back(manifest_update(u, rec[u], job.sharded));
    json groups = json::array();
    for (const auto& g : rec[u][0].groups)
      groups.push_back(reference_group(g, job.optimizer_kind, job.optimizer_class, obs.unsupported_optimizer));
    a.groups_per_update.push_back(groups);
  }
  for (int u = 0; u < K; ++u)
    for (int g = 1; g < W; ++g)
      if (rec[u][g].microsteps.size() != rec[u][0].microsteps.size())
        obs.notes += "rank " + std::to_string(g) + " ran " + std::to_string(rec[u][g].microsteps.size()) +
                     " forwards in update " + std::to_string(u) + ", rank 0 " +
                     std::to_string(rec[u][0].microsteps.size()) + "; ";

  RunPlan& run = obs.run;
  run.observed = true;
  const std::string model_source = observed_spec(req, job, plan, a, obs);
  run.plan = plan;
  std::vector<int64_t> targets = a.targets_of_id;
  targets.resize(static_cast<size_t>(run.spec.dataset.size), 0);  // examples the job never showed: unseen
  run.targets_of_id = targets;
  run.checked = plan;
  run.legs = {RunLegPlan{run.spec, plan, 0}};
  run.python = job.python;
  run.request.backend = "observed";
  run.request.world = W;
  run.request.run_dir = req.run_dir;
  for (const auto& arg : req.argv) run.request.command += (run.request.command.empty() ? "" : " ") + arg;
  out.plan_extras = {{"optimizer", {{"class", job.optimizer_class}, {"updates", a.groups_per_update}}},
                     {"frozen", job.frozen},
                     {"job", job.job}};
  const std::string facts = job_facts(job, run, a, model_source, rec);
  obs.notes = facts + (obs.notes.empty() ? "" : "; " + obs.notes.substr(0, obs.notes.size() - 2));
  return out;
}

void write_observed_folder(const ObservedFolder& folder, bool sharded, const std::string& nonce) {
  const RunPlan& run = folder.observed.run;
  const std::string& dir = run.request.run_dir;
  json plan_json = json::parse(plan_to_json(run.plan, run.spec));
  plan_json["observed"] = folder.plan_extras;
  write_file_atomic(dir + "/spec.json", spec_to_json(run.spec));
  write_file_atomic(dir + "/plan.json", plan_json.dump(1));
  write_dataset(dir, folder.samples);
  for (size_t g = 0; g < folder.ranks.size(); ++g)
    write_rank_record(dir, static_cast<int>(g), static_cast<int>(g), folder.ranks[g], nonce);
  write_manifest(dir, "observed", static_cast<int>(folder.ranks.size()), folder.manifest, nonce, sharded);
}

ObservedRun plan_observed(const ObserveRequest& req, const ObservedJob& job, const std::string& nonce) {
  ObservedFolder folder = observed_folder(req, job, read_records(req.run_dir, job, req.updates, nonce));
  write_observed_folder(folder, job.sharded, nonce);
  return std::move(folder.observed);
}

}  // namespace gradcert
