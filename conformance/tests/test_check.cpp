// `gradcert check RUN_DIR`: the checks of a run folder again, no rank launched. A checked run
// has the verdicts and figures of the run itself (built-in, and an external stack on the
// Python reference); a tampered tensor fails naming it; a planted bug stays caught; and a
// folder that lacks what a run leaves is exit 2 naming the file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "conformance/protocol/digests.hpp"
#include "conformance/protocol/run_folder.hpp"
#include "conformance/protocol/safetensors.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/tests/support.hpp"

using namespace gradcert;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kRepo = GRADCERT_SOURCE_DIR;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

RunRequest ddp_request(const std::string& run_dir, const std::string& inject = "") {
  RunRequest r;
  r.backend = "ddp";
  r.world = 2;
  r.inject = inject;
  r.exe = GRADCERT_EXE;
  r.run_dir = run_dir;
  return r;
}

RunReport check_folder(const std::string& dir) {
  return check_run({dir, "", test::fresh_dir("gradcert_check", "work")}).report;
}

// The same checks, verdicts, figures, tolerances and details, and the same diagnosis.
void expect_same_verdicts(const RunReport& run, const RunReport& checked) {
  ASSERT_EQ(test::ids_of(checked), test::ids_of(run));
  for (size_t i = 0; i < run.checks.size(); ++i) {
    const CheckResult &a = run.checks[i], &b = checked.checks[i];
    EXPECT_EQ(verdict_name(b.verdict), verdict_name(a.verdict)) << a.id;
    EXPECT_EQ(b.figure, a.figure) << a.id;
    EXPECT_EQ(b.tolerance, a.tolerance) << a.id;
    EXPECT_EQ(b.detail, a.detail) << a.id;
  }
  EXPECT_EQ(checked.diagnosis.note, run.diagnosis.note);
  EXPECT_EQ(checked.detected_by(), run.detected_by());
  EXPECT_EQ(checked.tensor_errors.size(), run.tensor_errors.size());
}

// The only run folder under <out>/runs/.
std::string only_run_folder(const std::string& out) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(out + "/runs")) found.push_back(e.path().string());
  EXPECT_EQ(found.size(), 1u) << out;
  return found.empty() ? "" : found[0];
}

// A report.json run, without what differs between a run and its check (time, provenance).
json comparable(json run) {
  run.erase("wall_seconds");
  run.erase("checked_from");
  return run;
}

}  // namespace

// (1) `run` then `check` through the command line: exit 0 both, the same report.json run
// (checks, memory, throughput), marked checked_from, and the same console table rows.
// --spec judges the same artifacts on other tolerances, and refuses a spec with another plan.
TEST(ConformanceCheck, BuiltInRunCheckedAgainIsTheSameReport) {
  const std::string root = test::fresh_dir("gradcert_check", "ddp");
  const auto ran = test::run_cli("run --backend ddp --world 2 --out " + root + "/run");
  ASSERT_EQ(ran.code, 0) << ran.out;
  const std::string folder = only_run_folder(root + "/run");
  const auto checked = test::run_cli("check " + folder + " --out " + root + "/check");
  ASSERT_EQ(checked.code, 0) << checked.out;
  const std::string header = "# gradcert check " + folder + ": the artifacts of the ddp dp2 float64 sgd run";
  EXPECT_NE(checked.out.find(header), std::string::npos) << checked.out;
  for (const char* row : {"grad.parity", "params.parity", "memory.", "# OK"})
    EXPECT_NE(checked.out.find(row), std::string::npos) << row << "\n" << checked.out;

  const json a = json::parse(slurp(root + "/run/report.json")), b = json::parse(slurp(root + "/check/report.json"));
  ASSERT_EQ(b["runs"].size(), 1u);
  EXPECT_EQ(b["runs"][0]["checked_from"], folder);
  EXPECT_FALSE(a["runs"][0].contains("checked_from"));
  EXPECT_EQ(comparable(b["runs"][0]), comparable(a["runs"][0]));
  EXPECT_EQ(b["spec"], a["spec"]);
  for (const char* section : {"memory", "throughput", "mutants", "verdict"})
    if (a.contains(section)) EXPECT_EQ(b[section], a[section]) << section;
  EXPECT_NE(slurp(root + "/check/report.md").find("Checked again from the run folder `" + folder + "`"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(root + "/check/junit.xml"));

  // --spec: other tolerances judge the same artifacts; a spec with another plan is refused.
  std::ofstream(root + "/strict.json") << R"({"tolerance": {"float64": 1e-16, "floor_factor": 0}})";
  const auto strict = test::run_cli("check " + folder + " --spec " + root + "/strict.json --out " + root + "/strict");
  EXPECT_EQ(strict.code, 1) << strict.out;
  std::ofstream(root + "/other.json") << R"({"batch": {"micro": 3}})";
  const auto other = test::run_cli("check " + folder + " --spec " + root + "/other.json --out " + root + "/other");
  EXPECT_EQ(other.code, 2) << other.out;
  EXPECT_NE(other.out.find(folder + "/plan.json: differs from the plan the spec makes, at update_batch"),
            std::string::npos)
      << other.out;
}

// (2) An external stack (the PyTorch DDP adapter) on a model factory: the Python reference
// runner recomputes the reference and the diagnosis's pieces; the same verdicts and figures.
TEST(ConformanceCheck, ExternalModelRunCheckedAgainOnThePythonReference) {
  RunRequest r;
  r.backend = kExternalBackend;
  r.world = 2;
  r.spec.topology.dp = 2;
  r.spec.model.factory = "gradcert.tiny_lm:tiny_lm";
  r.spec.timeout.run_s = 240;
  r.spec.timeout.collective_s = 60;
  r.command = kRepo +
              "/.venv/bin/torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 "
              "--master_port=$GRADCERT_MASTER_PORT " +
              kRepo + "/backends/python/torch_ddp.py";
  r.exe = GRADCERT_EXE;
  r.run_dir = test::fresh_dir("gradcert_check", "external") + "/runs/torch-ddp";
  const RunReport run = run_backend(r);
  ASSERT_TRUE(run.error.empty()) << run.error;
  ASSERT_TRUE(run.passed()) << test::failures(run);
  ASSERT_TRUE(run.diagnosis.ran) << run.diagnosis.note;
  const std::string work = test::fresh_dir("gradcert_check", "external_work");
  const RunReport checked = check_run({r.run_dir, "", work}).report;
  ASSERT_TRUE(checked.error.empty()) << checked.error;
  EXPECT_EQ(checked.checked_from, r.run_dir);
  EXPECT_TRUE(checked.diagnosis.ran) << checked.diagnosis.note;
  EXPECT_EQ(checked.diagnosis.best.id, "global-mean") << checked.diagnosis.note;
  expect_same_verdicts(run, checked);
  EXPECT_TRUE(fs::exists(work + "/reference/manifest.json")) << "the reference goes to the work folder";
}

// (3) Tampering: one gradient tensor scaled by 1.001 in the archived folder fails grad.parity
// naming the tensor (exit 1); (4) what a run leaves, missing or partial or another run's, is
// exit 2 naming the file.
TEST(ConformanceCheck, TamperedOrIncompleteFoldersAreNamed) {
  const std::string root = test::fresh_dir("gradcert_check", "tamper");
  RunRequest r = ddp_request(root + "/good");
  const RunReport run = run_backend(r);
  ASSERT_TRUE(run.passed()) << test::failures(run);
  auto copy_of = [&](const std::string& name) {
    const std::string dir = root + "/" + name;
    fs::copy(r.run_dir, dir, fs::copy_options::recursive);
    return dir;
  };

  const std::string scaled = copy_of("scaled");
  TensorMap grads = read_safetensors(scaled + "/u1.grads.safetensors");
  for (auto& kv : grads) kv.second.hold();  // the file is rewritten below
  HostTensor& t = grads.rbegin()->second;
  for (double& v : t.held) v *= 1.001;
  write_safetensors(scaled + "/u1.grads.safetensors", grads, {{"update", "1"}});
  // Unless its digests are taken again, the changed file is refused as such (NOTE [artifact
  // digests]; CheckedFolderRefusesAnyFlippedBit); with them, the checks themselves must catch it.
  write_digests(scaled, run_folder_nonce(scaled));
  const RunReport bad = check_folder(scaled);
  ASSERT_TRUE(bad.error.empty()) << bad.error;
  const CheckResult* g = nullptr;
  for (const auto& c : bad.checks)
    if (c.id == "grad.parity") g = &c;
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->verdict, Verdict::Fail);
  EXPECT_NE(g->detail.find(t.name), std::string::npos) << g->detail;
  EXPECT_NEAR(g->figure, 1e-3, 1e-6) << g->detail;
  const auto cli = test::run_cli("check " + scaled + " --out " + root + "/scaled_report");
  EXPECT_EQ(cli.code, 1) << cli.out;
  EXPECT_NE(cli.out.find(t.name), std::string::npos) << cli.out;

  const std::string partial = copy_of("partial");
  const std::string rank1 = slurp(partial + "/rank1.json");
  std::ofstream(partial + "/rank1.json", std::ios::trunc) << rank1.substr(0, rank1.size() / 2);
  const std::string other = copy_of("other");
  std::string manifest = slurp(other + "/manifest.json");
  const std::string nonce = run_folder_nonce(other);
  manifest.replace(manifest.find(nonce), nonce.size(), std::string(32, '0'));
  std::ofstream(other + "/manifest.json", std::ios::trunc) << manifest;
  const std::string no_memory = copy_of("no_memory");
  fs::remove(no_memory + "/rank1.memory.json");
  const std::string no_record = copy_of("no_record");
  fs::remove(no_record + "/run.json");
  const std::string plan_edit = copy_of("plan_edit");
  {
    json plan = json::parse(slurp(plan_edit + "/plan.json"));
    plan["windows"][1]["ids"][0] = 999;
    std::ofstream(plan_edit + "/plan.json", std::ios::trunc) << plan.dump(1);
  }
  for (const std::string& dir : {partial, other, no_memory, plan_edit})  // the checks' own defences
    write_digests(dir, run_folder_nonce(dir));
  for (const auto& [dir, says] : std::vector<std::pair<std::string, std::string>>{
           {partial, partial + "/rank1.json: "},
           {other, other + "/manifest.json: nonce \"" + std::string(32, '0') + "\" is not this run's"},
           {no_memory, no_memory + "/rank1.memory.json: cannot be read (missing?)"},
           {no_record, no_record + "/run.json: cannot be read (missing?)"},
           {plan_edit, plan_edit + "/plan.json: differs from the plan the spec makes, at windows[1].ids[0]"}}) {
    const auto c = test::run_cli("check " + dir + " --out " + dir + "_report");
    EXPECT_EQ(c.code, 2) << c.out;
    EXPECT_NE(c.out.find(says), std::string::npos) << "expected: " << says << "\n" << c.out;
  }
}

// Issue 36 item 6: `gradcert check` of an archived run refuses one flipped bit in any file the run
// wrote, naming the file (the figure of a flipped low bit in a tensor moved by 1e-16 and passed).
TEST(ConformanceCheck, CheckedFolderRefusesAnyFlippedBit) {
  const std::string root = test::fresh_dir("gradcert_check", "bitflip");
  RunRequest r = ddp_request(root + "/good");
  ASSERT_TRUE(run_backend(r).passed());
  const json listed = json::parse(slurp(r.run_dir + "/" + kDigestsFile))["files"];
  ASSERT_GT(listed.size(), 10u);
  for (const std::string must : {"manifest.json", "rank1.json", "u1.grads.safetensors", "u0.params.safetensors",
                                 "spec.json", "run.json", "initial.safetensors"})
    EXPECT_TRUE(listed.contains(must)) << must;
  int refused = 0, flipped = 0;
  for (auto it = listed.begin(); it != listed.end(); ++it) {
    const std::string dir = root + "/flip";
    fs::remove_all(dir);
    fs::copy(r.run_dir, dir, fs::copy_options::recursive);
    {
      std::fstream f(dir + "/" + it.key(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(0, std::ios::end);
      const auto at = static_cast<std::streamoff>(f.tellg()) - 1;  // a tensor's last byte: its low bits
      if (at < 0) continue;                                        // an empty file has no bit to flip
      ++flipped;
      char c = 0;
      f.seekg(at);
      f.get(c);
      f.seekp(at);
      f.put(static_cast<char>(c ^ 0x01));
    }
    try {
      check_run({dir, "", test::fresh_dir("gradcert_check", "flipwork")});
      ADD_FAILURE() << it.key() << ": a flipped bit was not refused";
    } catch (const ArtifactError& e) {
      // run.json and the folder's marker are read for the nonce before the digests: a flip there
      // is refused as a malformed file (still named); every other file by its digest.
      const bool read_first = it.key() == "run.json" || it.key() == kRunFolderMarker;
      const std::string says = dir + "/" + it.key() + (read_first ? ": " : ": its bytes are not those the run wrote");
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_EQ(refused, flipped);
  EXPECT_GT(flipped, 10);
  const auto c = test::run_cli("check " + root + "/flip --out " + root + "/flip_report");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("its SHA-256 differs from digests.json"), std::string::npos) << c.out;
}

// (4) A run whose rank was killed left no manifest: its folder is exit 2 naming it.
TEST(ConformanceCheck, FolderOfAKilledRunIsRefusedNamingTheManifest) {
  RunRequest r = ddp_request(test::fresh_dir("gradcert_check", "killed") + "/runs/ddp");
  r.spec.timeout.collective_s = 3;
  r.spec.timeout.run_s = 60;
  ::setenv("GRADCERT_FAULT", "kill:1:0", 1);
  const RunReport run = run_backend(r);
  ::unsetenv("GRADCERT_FAULT");
  ASSERT_FALSE(run.error.empty());
  ASSERT_TRUE(fs::exists(r.run_dir + "/run.json")) << "run.json is written before the launch";
  const auto c = test::run_cli("check " + r.run_dir + " --out " + r.run_dir + "_report");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("bad artifacts: " + r.run_dir + "/manifest.json: cannot be read (missing?)"), std::string::npos)
      << c.out;
}

// (5) A planted bug's folder checked again is still caught, by the same checks (exit 0, as
// `run --inject` exits when the bug is caught).
TEST(ConformanceCheck, InjectedMutantCheckedAgainStillFails) {
  const RunRequest r = ddp_request(test::fresh_dir("gradcert_check", "mutant") + "/runs/ddp-local-mean", "local-mean");
  const RunReport run = run_backend(r);
  ASSERT_TRUE(run.error.empty()) << run.error;
  ASSERT_FALSE(run.detected_by().empty());
  const RunReport checked = check_folder(r.run_dir);
  EXPECT_EQ(checked.inject, "local-mean");
  EXPECT_FALSE(checked.passed());
  expect_same_verdicts(run, checked);
  const auto c = test::run_cli("check " + r.run_dir + " --out " + r.run_dir + "_report");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("local-mean"), std::string::npos) << c.out;
}

// Teacher forcing and the noise floor at size (NOTE [teacher forcing], NOTE [noise floor]):
// a correct float32 ddp run of 2.7M parameters over 6 updates drifts from the free-running
// reference by 3.5e-3 at the last update (measured), 170 times the calibrated float32
// tolerance (2e-5), so a free-running comparison at a fixed tolerance fails it. The
// teacher-forced checks pass it, each tolerance set from the run's own floor; checked again
// with floor_factor 0 (the calibrated tolerances alone) it fails, on the trajectory.
TEST(ConformanceCheck, CorrectRunAtSizePassesOnTeacherForcingAndItsNoiseFloor) {
  const std::string root = test::fresh_dir("gradcert_check", "size");
  std::ofstream(root + "/spec.json")
      << R"({"model": {"d_model": 192, "heads": 4, "layers": 6, "d_ff": 768}, "dtype": "float32", "updates": 6})";
  const auto run = test::run_cli("run --backend ddp --world 2 --spec " + root + "/spec.json --out " + root + "/run");
  ASSERT_EQ(run.code, 0) << run.out;
  const json report = json::parse(slurp(root + "/run/report.json"));
  std::map<std::string, json> checks;
  for (const auto& c : report["runs"][0]["checks"]) checks[c["id"]] = c;
  // The trajectory passes held to its floors (its figure is the update with the largest
  // error / tolerance, not the largest drift: that one is measured below, at the calibrated tolerance).
  EXPECT_EQ(checks["params.trajectory"]["verdict"], "pass");
  for (const char* id : {"grad.parity", "params.parity", "loss.global_mean", "grad.scale"}) {
    EXPECT_EQ(checks[id]["verdict"], "pass") << id;
    EXPECT_GT(checks[id]["noise_floor"].get<double>(), 0) << id;
    EXPECT_EQ(checks[id]["floor_factor"].get<double>(), 10) << id;
  }
  EXPECT_GT(checks["grad.parity"]["noise_floor"].get<double>(), 1e-6);  // float32 rounding at 2.7M
  std::ofstream(root + "/fixed.json")
      << R"({"model": {"d_model": 192, "heads": 4, "layers": 6, "d_ff": 768}, "dtype": "float32", "updates": 6,)"
      << R"( "tolerance": {"floor_factor": 0}})";
  const std::string folder = root + "/run/runs/ddp-w2-float32-sgd";
  const auto fixed = test::run_cli("check " + folder + " --spec " + root + "/fixed.json --out " + root + "/fixed");
  EXPECT_EQ(fixed.code, 1) << fixed.out;
  const json f = json::parse(slurp(root + "/fixed/report.json"));
  for (const auto& c : f["runs"][0]["checks"])
    if (c["id"] == "params.trajectory") {
      EXPECT_EQ(c["verdict"], "fail") << c.dump();
      EXPECT_GT(c["figure"].get<double>(), 2e-5 * 3) << c.dump();  // the free-running drift (3.5e-3 measured)
    }
}
