// `gradcert observe`: run the job, find out what it recorded, certify it (observe.hpp).
#include "conformance/protocol/digests.hpp"
#include "conformance/run/observe.hpp"

#include "conformance/protocol/variables.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <regex>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "conformance/core/files.hpp"
#include "conformance/core/format.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/fields.hpp"
#include "conformance/launch/launcher.hpp"
#include "conformance/protocol/run_folder.hpp"
#include "conformance/run/check_artifacts.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/run/run_source.hpp"

namespace gradcert {

namespace fs = std::filesystem;

namespace {

// The report's optimizer column: the rule the reference steps (sgd, adam, adamw), else the class's
// own name (the diagnosis names the full class).
std::string optimizer_label(const ObservedJob& job) {
  if (!job.optimizer_kind.empty()) return job.optimizer_kind;
  const auto dot = job.optimizer_class.rfind('.');
  return dot == std::string::npos ? job.optimizer_class : job.optimizer_class.substr(dot + 1);
}

const char* const kWhy = "add `gradcert.watch(model, optimizer)` after the job builds them (or "
                         "`callbacks=[gradcert.hf.Callback()]` to an HF Trainer), and run the job in a Python "
                         "environment where `import gradcert` works (docs/observe.md)";

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

// How many consecutive updates rank g recorded (observed.rank<g>.u0.json, u1, ...).
int updates_recorded(const std::string& dir, int rank) {
  int k = 0;
  while (exists(dir + "/" + observed_update_file(rank, k))) ++k;
  return k;
}

// "rank 0: updates 0..2, rank 1: updates 0..1": what each rank got through.
std::string progress(const std::string& dir, int world) {
  std::string out;
  for (int g = 0; g < world; ++g) {
    const int k = updates_recorded(dir, g);
    out += (g ? ", " : "") + std::string("rank ") + std::to_string(g) + ": " +
           (k == 0   ? "none"
            : k == 1 ? "update 0"
                     : "updates 0.." + std::to_string(k - 1));
  }
  return out;
}

// "rank 1 ended first (after update 1; rank 0 got through update 2)" when the ranks' progress
// differs: the rank that died or stopped is the one that recorded least. "" when all agree.
std::string first_to_end(const std::string& dir, int world) {
  int lo = 1 << 30, hi = 0;
  for (int g = 0; g < world; ++g)
    lo = std::min(lo, updates_recorded(dir, g)), hi = std::max(hi, updates_recorded(dir, g));
  if (lo == hi) return "";
  std::string ranks;
  for (int g = 0; g < world; ++g)
    if (updates_recorded(dir, g) == lo) ranks += (ranks.empty() ? "" : ", ") + std::to_string(g);
  return "rank " + ranks + " ended first, " +
         (lo == 0 ? "before recording any update" : "after recording update " + std::to_string(lo - 1)) +
         " (another rank got through update " + std::to_string(hi - 1) + "): ";
}

// Any rank's error file, as one message naming the rank and the update.
std::string rank_errors(const std::string& dir) {
  std::string out;
  for (const auto& e : read_observed_errors(dir))
    out += (out.empty() ? "" : "; ") + std::string("rank ") + std::to_string(e.rank) + ", update " +
           std::to_string(e.update) + ": " + e.error;
  return out;
}

// "rank 1 died in update 0: RuntimeError: ... (File ..., line N, in f)": each rank's own uncaught
// exception, which torchrun's summary does not quote; the rank that died in the earliest update
// first (the others' errors are often its echo: "Connection closed by peer").
std::string rank_deaths(const std::string& dir) {
  std::string out;
  auto deaths = read_observed_errors(dir, "died");  // the earliest update first: the cause, then its echoes
  std::stable_sort(deaths.begin(), deaths.end(),
                   [](const ObservedError& a, const ObservedError& b) { return a.update < b.update; });
  for (const auto& e : deaths)
    out += std::string(out.empty() ? "" : "\n") + "rank " + std::to_string(e.rank) + " died in update " +
           std::to_string(e.update) + ": " + e.error + (e.where.empty() ? "" : " (" + e.where + ")");
  return out;
}

// batch.sample_ledger names gradcert's example ids; for an observed job each is also named by what
// the user can find in their data: its content key and first tokens ("id 7 (content c1f..., tokens 5 9 ...) by").
void name_examples(RunReport& report, const std::map<int64_t, std::string>& names) {
  static const std::regex id_by(R"(id ([0-9]+) by )");
  for (auto& c : report.checks) {
    if (c.id != "batch.sample_ledger" || c.verdict != Verdict::Fail) continue;
    std::string out;
    auto from = c.detail.cbegin();
    for (std::smatch m; std::regex_search(from, c.detail.cend(), m, id_by); from = m.suffix().first) {
      const auto it = names.find(std::stoll(m[1].str()));
      out += std::string(from, m[0].first) + "id " + m[1].str() + (it == names.end() ? "" : " (" + it->second + ")") +
             " by ";
    }
    c.detail = out + std::string(from, c.detail.cend());
  }
}

// The params.* checks when the reference cannot step the job's optimizer: a skip naming it.
void skip_params_checks(RunReport& report, const std::string& why) {
  for (auto& c : report.checks)
    if (c.id == "params.parity" || c.id == "params.trajectory") {
      c.verdict = Verdict::Skip;
      c.figure = 0;
      c.detail = "the job's optimizer is " + why +
                 ", which gradcert's reference does not step (SGD, Adam, AdamW "
                 "without amsgrad / nesterov / dampening / maximize): the gradients are compared, the step is not";
    }
}

// NOTE [observe record] observe.json: the request an observed run folder was made with (the job's
// command, K, --expect-batch, --model, dropout, device) and its nonce, so that `gradcert check`
// judges the folder again as `gradcert observe` did, from the job's own records in it.
void write_observe_record(const ObserveRequest& req, const std::string& nonce) {
  const nlohmann::json j = {{"schema", "gradcert.observe/1"},
                            {"argv", req.argv},
                            {"updates", req.updates},
                            {"expect_batch", req.expect_batch},
                            {"model", req.model},
                            {"keep_dropout", req.keep_dropout},
                            {"device", req.device},
                            {"out_dir", req.out_dir},
                            {"nonce", nonce}};
  write_file_atomic(req.run_dir + "/observe.json", j.dump(1));
}

ObserveRequest read_observe_record(const std::string& dir, std::string& nonce) {
  const std::string path = dir + "/observe.json";
  const nlohmann::json j = parse_artifact_json(read_text_file(path), path);
  const Fields f{j, path};
  f.schema("gradcert.observe/1");
  ObserveRequest req;
  const nlohmann::json& argv = f.at("argv");
  if (!argv.is_array() || argv.empty()) f.fail("field 'argv' must be the job's command, an array of strings");
  for (const auto& a : argv) {
    if (!a.is_string()) f.fail("field 'argv' holds a non-string: " + json_excerpt(a));
    req.argv.push_back(a.get<std::string>());
  }
  req.updates = static_cast<int>(f.integer("updates", 1, 1 << 20));
  req.expect_batch = f.integer("expect_batch", 0, int64_t(1) << 40);
  req.model = f.string("model");
  req.keep_dropout = f.boolean("keep_dropout");
  req.device = f.string("device");
  req.out_dir = f.string("out_dir");
  req.run_dir = dir;
  nonce = f.string("nonce");
  return req;
}

// The checks on what the job recorded (NOTE [observed plan]), as `observe` and `check` both judge
// it; the Python reference writes under work_dir. Records gradcert cannot certify set the error.
RunReport judge_observed(const ObserveRequest& req, const ObservedJob& job, const std::string& nonce,
                         const std::string& work_dir, RunPlan* run) {
  ObservedRun observed;
  RunReport report;
  report.backend = "observed";
  report.run_dir = req.run_dir;
  report.updates = req.updates;
  report.topology = {job.world, 1, 1};
  report.dtype = job.dtype;
  report.optimizer = optimizer_label(job);
  try {
    observed = plan_observed(req, job, nonce);
  } catch (const ArtifactError& e) {
    report.error = std::string("bad observed records: ") + e.what();
    return report;
  } catch (const std::invalid_argument& e) {
    report.error = e.what();
    return report;
  }
  if (run) *run = observed.run;
  RunReport checked = report_of(observed.run);
  checked.optimizer = optimizer_label(job);
  check_artifacts(checked, observed.run, nonce, work_dir);
  if (!observed.unsupported_optimizer.empty()) skip_params_checks(checked, observed.unsupported_optimizer);
  name_examples(checked, observed.example_names);
  checked.diagnosis.note = observed.notes + (checked.diagnosis.note.empty() ? "" : "; " + checked.diagnosis.note);
  return checked;
}

}  // namespace

// `gradcert observe ... -- CMD`: what reruns this observed run (the report's Reproduce line).
std::string observe_command(const ObserveRequest& req) {
  std::string c = "gradcert observe --out " + shell_word(req.out_dir.empty() ? req.run_dir : req.out_dir) +
                  " --updates " + std::to_string(req.updates);
  if (req.expect_batch > 0) c += " --expect-batch " + std::to_string(req.expect_batch);
  if (!req.model.empty()) c += " --model " + shell_word(req.model);
  if (req.keep_dropout) c += " --keep-dropout";
  if (req.device != "cpu") c += " --device " + shell_word(req.device);
  c += " --";
  for (const auto& a : req.argv) c += " " + shell_word(a);
  return c;
}

RunReport observe_job(const ObserveRequest& req, RunPlan* run) {
  if (req.argv.empty())
    throw std::invalid_argument("gradcert observe: no command after `--` (e.g. -- torchrun ... train.py)");
  if (req.updates < 1 || req.updates > kMaxObservedUpdates)
    throw std::invalid_argument("--updates: must be in [1, " + std::to_string(kMaxObservedUpdates) + "], got " +
                                std::to_string(req.updates) +
                                " (every observed update is a file of the job's tensors)");
  if (req.expect_batch < 0)
    throw std::invalid_argument("--expect-batch: must be >= 1, got " + std::to_string(req.expect_batch));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string& dir = req.run_dir;
  RunReport report;
  report.backend = "observed";
  report.run_dir = dir;
  report.updates = req.updates;
  const std::string nonce = prepare_run_folder(dir);  // NOTE [run nonce]
  write_observe_record(req, nonce);                   // NOTE [observe record]
  // The job's own launch command under the recorder's variables (NOTE [run sources]).
  const auto source = observed_job(req.argv, dir, req.updates, req.keep_dropout, req.device, req.timeout_s);
  LaunchResult launched = launch(source->leg(0, nonce));
  try {
    write_digests(dir, nonce);  // the job's records as it left them (NOTE [artifact digests])
  } catch (const std::exception& e) {
    launched.message = std::string("the job ended, but its records' digests: ") + e.what();
    launched.ok = false;
  }
  report.interrupted = launched.interrupted;
  report.reproduce = observe_command(req);
  auto finish = [&](RunReport& r) -> RunReport {
    r.reproduce = report.reproduce;
    r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::move(r);
  };
  const std::string deaths = rank_deaths(dir);
  const std::string failed =
      launched.ok ? "" : name_full_disk((deaths.empty() ? "" : deaths + "\n") + source->failure(launched.message));
  if (const std::string errors = rank_errors(dir); !errors.empty()) {
    report.error = "the gradcert integration stopped the job: " + errors + (failed.empty() ? "" : "\n" + failed);
    return finish(report);
  }
  if (!exists(dir + "/observed.json")) {
    report.error = launched.ok ? "the job ended (exit 0) without recording anything: no gradcert integration ran in it "
                                 "(no observed.json in " +
                                     dir + "); " + kWhy
                               : failed + "\nIt recorded nothing (no observed.json): if the job does run, " + kWhy;
    return finish(report);
  }
  ObservedJob job;
  try {
    job = read_observed_job(dir, nonce);
  } catch (const ArtifactError& e) {
    report.error = std::string("bad observed records: ") + e.what() + (failed.empty() ? "" : "\n" + failed);
    return finish(report);
  }
  report.topology = {job.world, 1, 1};
  report.dtype = job.dtype;
  report.optimizer = optimizer_label(job);
  int done = req.updates;
  for (int g = 0; g < job.world; ++g) done = std::min(done, updates_recorded(dir, g));
  if (exists(dir + "/" + observed_update_file(job.world, 0)))
    report.error = "rank " + std::to_string(job.world) + " recorded update 0, but the job started with world " +
                   std::to_string(job.world) + " (the world changed mid-run): gradcert observe certifies one world";
  else if (!launched.ok)
    report.error = first_to_end(dir, job.world) + failed +
                   "\nWhat every rank recorded before it ended: " + progress(dir, job.world) +
                   (done < req.updates ? " (update " + std::to_string(done) + " never completed)" : "");
  else if (done < req.updates)
    report.error = "the job ended (exit 0) after " + std::to_string(done) + " of the --updates " +
                   std::to_string(req.updates) + " updates gradcert asked for (" + progress(dir, job.world) +
                   (done == 0 ? "; it never called the optimizer's step" : "") +
                   "): its data ran out or it stopped early; certify fewer updates with --updates " +
                   std::to_string(std::max(1, done));
  if (!report.error.empty()) return finish(report);

  RunReport checked = judge_observed(req, job, nonce, dir, run);
  checked.interrupted = report.interrupted;
  return finish(checked);
}

CheckedRun check_observed(const CheckRequest& c) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!c.spec_path.empty())
    throw std::invalid_argument("--spec: an observed run folder's spec is what the job did (" + c.run_dir +
                                "/observe.json); it is checked on that alone");
  std::string nonce;
  ObserveRequest req = read_observe_record(c.run_dir, nonce);
  if (run_folder_nonce(c.run_dir) != nonce)
    throw ArtifactError(c.run_dir + "/observe.json: field 'nonce' is not the run folder's: an observe.json from "
                                    "another run?");
  verify_digests(c.run_dir, nonce);  // NOTE [artifact digests]
  const ObservedJob job = read_observed_job(c.run_dir, nonce);
  std::error_code ec;
  fs::create_directories(c.work_dir, ec);
  if (ec) throw std::invalid_argument(c.work_dir + ": cannot create: " + ec.message());
  RunPlan run;
  RunReport report = judge_observed(req, job, nonce, c.work_dir, &run);
  report.checked_from = c.run_dir;
  report.reproduce = observe_command(req);
  if (!report.interrupted) report.interrupted = interrupt_signal();
  report.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {run.spec, LauncherKind::Local, std::move(report)};
}

}  // namespace gradcert
