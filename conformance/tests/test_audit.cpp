// The migration audit (`gradcert audit`): two stacks on the same plan, each certified
// against the reference and compared with each other tensor by tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "conformance/tests/support.hpp"
#include "conformance/audit/audit.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

const std::string kRepo = GRADCERT_SOURCE_DIR;

std::string fresh_dir(const std::string& name) { return test::fresh_dir("gradcert_test_audit", name); }

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

AuditRequest request(const std::string& before, const std::string& after, const std::string& name) {
  AuditRequest q;
  q.before = before;
  q.after = after;
  q.world = 2;
  q.spec.timeout.run_s = 120;
  q.spec.timeout.collective_s = 60;
  q.exe = GRADCERT_EXE;
  q.root = kRepo;
  q.out_dir = fresh_dir(name);
  return q;
}

bool mentions(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += "\n  " + l;
  return s;
}

}  // namespace

// Names: built-ins run as built-in, fsdp1/fsdp2/torch-ddp map to the adapters' commands
// (command.sh), external:<command> runs anything, NAME+inject=MUTANT plants a bug.
TEST(ConformanceAuditNames, ResolvesBuiltinsAdaptersAndExternal) {
  const AuditSide ddp = resolve_audit_side("ddp", "", "");
  EXPECT_EQ(ddp.backend, "ddp");
  EXPECT_TRUE(ddp.command.empty());
  const AuditSide bug = resolve_audit_side("zero2+inject=local-mean", "", "");
  EXPECT_EQ(bug.backend, "zero2");
  EXPECT_EQ(bug.inject, "local-mean");
  const AuditSide ext = resolve_audit_side("external:./my_stack.sh --x", "", "");
  EXPECT_EQ(ext.backend, kExternalBackend);
  EXPECT_EQ(ext.command, "./my_stack.sh --x");
  EXPECT_THROW(resolve_audit_side("megatron", "", ""), std::invalid_argument);
  EXPECT_THROW(resolve_audit_side("ddp+inject=local-mean", "micro-mean", ""), std::invalid_argument);
  if (!fs::exists(kRepo + "/.venv/bin/torchrun")) GTEST_SKIP() << "no venv: the adapter names need scripts/bootstrap";
  for (const auto& [alias, script] : std::vector<std::pair<std::string, std::string>>{{"fsdp1", "torch_fsdp1.py"},
                                                                                      {"fsdp2", "torch_fsdp2.py"},
                                                                                      {"torch-fsdp2", "torch_fsdp2.py"},
                                                                                      {"torch-ddp", "torch_ddp.py"}}) {
    const AuditSide a = resolve_audit_side(alias, "", kRepo);
    EXPECT_EQ(a.backend, kExternalBackend) << alias;
    EXPECT_NE(a.command.find("/backends/python/" + script), std::string::npos) << a.command;
    EXPECT_NE(a.command.find("$GRADCERT_MASTER_PORT"), std::string::npos) << a.command;
  }
  EXPECT_NE(resolve_audit_side("fsdp2+inject=local-mean", "", kRepo).command.find("--mutant local-mean"),
            std::string::npos);
  // The adapters plant the ids adapters.json lists for them, and nothing else.
  EXPECT_NE(resolve_audit_side("fsdp2", "micro-mean", kRepo).command.find("--mutant micro-mean"), std::string::npos);
  EXPECT_THROW(resolve_audit_side("fsdp2", "stale-gathered-params", kRepo), std::invalid_argument);
  // A fresh clone: the checkout is found from the executable (build/gradcert -> the repo).
  EXPECT_TRUE(fs::equivalent(locate_repo_root(GRADCERT_EXE), kRepo));
}

// The notes that commonly change from FSDP1 to FSDP2, marked for this run's spec.
TEST(ConformanceAuditNames, Fsdp1ToFsdp2NotesFollowTheSpec) {
  Spec s;
  s.topology.dp = 2;
  auto notes = migration_notes("torch-fsdp1", "torch-fsdp2", s, make_plan(s));
  auto applies = [&](const std::string& id) {
    for (const auto& n : notes)
      if (n.id == id) return n.applies;
    ADD_FAILURE() << "no note " << id;
    return false;
  };
  EXPECT_FALSE(applies("reduce-dtype"));  // float64: no mixed precision
  EXPECT_TRUE(applies("divide-factor"));
  EXPECT_TRUE(applies("grad-sync"));  // A = 3
  EXPECT_FALSE(applies("state-dict"));
  EXPECT_TRUE(applies("flat-params"));
  s.dtype = DType::BFloat16;
  s.batch.accum = 1;
  notes = migration_notes("torch-fsdp1", "torch-fsdp2", s, make_plan(s));
  EXPECT_TRUE(applies("reduce-dtype"));
  EXPECT_FALSE(applies("grad-sync"));
}

// (a) Built-in ddp -> zero2 through the CLI: exit 0, the verdict, the three files.
TEST(ConformanceAudit, DdpToZero2PreservesSemanticsFromTheCli) {
  const std::string out = fresh_dir("cli");
  const std::string cmd = std::string(GRADCERT_EXE) + " audit --before ddp --after zero2 --world 2 --out " + out +
                          " > " + out + "/console.txt 2>&1";
  const int status = std::system(cmd.c_str());
  const std::string console = slurp(out + "/console.txt");
  ASSERT_TRUE(WIFEXITED(status)) << console;
  EXPECT_EQ(WEXITSTATUS(status), 0) << console;
  EXPECT_NE(console.find("# verdict: the migration preserves training semantics"), std::string::npos) << console;
  EXPECT_NE(console.find("blocks.0.qkv.weight"), std::string::npos) << console;
  EXPECT_NE(console.find("step time (median over updates)"), std::string::npos) << console;
  const auto j = nlohmann::json::parse(slurp(out + "/audit.json"));
  EXPECT_EQ(j["schema"], "gradcert.audit/1");
  EXPECT_EQ(j["verdict"], "preserved");
  EXPECT_EQ(j["updates"].size(), 3u);
  EXPECT_EQ(j["updates"][0]["update_batch"]["before"], 12);
  EXPECT_EQ(j["updates"][2]["valid_targets"]["before"], j["updates"][2]["valid_targets"]["after"]);
  EXPECT_FALSE(j["tensors"].empty());
  for (const auto& t : j["tensors"]) EXPECT_LE(t["grad"]["rel_l2"].get<double>(), 1e-10) << t.dump();
  EXPECT_NE(slurp(out + "/audit.md").find("the migration preserves training semantics"), std::string::npos);
  EXPECT_NE(slurp(out + "/junit.xml").find("testsuite name=\"gradcert.audit\""), std::string::npos);
  // Bad input: exit 2, the message names the unknown backend.
  const int bad = std::system(
      (std::string(GRADCERT_EXE) + " audit --before ddp --after nope --out " + out + "/bad > " + out + "/bad.txt 2>&1")
          .c_str());
  EXPECT_EQ(WEXITSTATUS(bad), 2);
  EXPECT_NE(slurp(out + "/bad.txt").find("unknown backend 'nope'"), std::string::npos);
}

// (b) ddp -> ddp with a planted bug on the after side: the failing check and the
// gradient difference between the two sides are both in the report.
TEST(ConformanceAudit, PlantedBugOnTheAfterSideIsListed) {
  AuditRequest q = request("ddp", "ddp", "bug");
  q.after_inject = "local-mean";
  const AuditReport r = run_audit(q, std::cout);
  ASSERT_FALSE(r.run_failed()) << r.before.error << r.after.error;
  EXPECT_TRUE(r.before.passed());
  EXPECT_FALSE(r.preserved());
  EXPECT_TRUE(mentions(r.differences, "after (ddp): check grad.parity failed")) << joined(r.differences);
  EXPECT_TRUE(mentions(r.differences, "gradients differ between the two sides")) << joined(r.differences);
  EXPECT_TRUE(mentions(r.differences, "parameters differ between the two sides")) << joined(r.differences);
  const std::string table = audit_table(r);
  EXPECT_NE(table.find("# FAILED"), std::string::npos) << table;
  EXPECT_NE(audit_junit(r).find("<failure"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(audit_json(r))["verdict"], "differences");
}

// (c) The PyTorch FSDP1 -> FSDP2 migration through the adapters (torchrun, Gloo, CPU).
TEST(ConformanceAuditTorch, Fsdp1ToFsdp2PreservesSemantics) {
  if (!fs::exists(kRepo + "/.venv/bin/torchrun"))
    GTEST_SKIP() << kRepo << "/.venv/bin/torchrun is missing: run scripts/bootstrap for the venv";
  const AuditRequest q = request("fsdp1", "fsdp2", "fsdp");
  const AuditReport r = run_audit(q, std::cout);
  if (!r.before.error.empty()) {  // FSDP1 refused CPU: the adapter says why ("SKIP: ...")
    const std::string all = slurp(r.before.run_dir + "/rank0.log") + "\n" + r.before.error;
    if (const auto at = all.find("SKIP:"); at != std::string::npos)
      GTEST_SKIP() << all.substr(at, all.find('\n', at) - at);
  }
  ASSERT_FALSE(r.run_failed()) << r.before.error << r.after.error;
  EXPECT_TRUE(r.preserved()) << joined(r.differences);
  EXPECT_EQ(r.before_facts.versions.at("adapter"), "torch-fsdp1");
  EXPECT_EQ(r.after_facts.versions.at("adapter"), "torch-fsdp2");
  const std::string table = audit_table(r);
  for (const char* s : {"no_sync()", "set_requires_gradient_sync(False)", "MixedPrecisionPolicy", "divide factor",
                        "FULL_STATE_DICT", "DTensor", "the migration preserves training semantics"})
    EXPECT_NE(table.find(s), std::string::npos) << s << "\n" << table;
  std::cout << table;
}
