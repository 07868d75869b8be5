// Hardening, torch-free: safetensors as strict as Python safetensors 0.8, non-finite
// gradients reported as such, the TP = 1 estimate, and run folders gradcert may empty.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "conformance/checks/checks.hpp"
#include "conformance/core/files.hpp"
#include "conformance/memory/memory.hpp"
#include "conformance/protocol/run_folder.hpp"
#include "conformance/protocol/safetensors.hpp"
#include "conformance/tests/temp_dirs.hpp"
#include "reports/report.hpp"

using namespace gradcert;
namespace fs = std::filesystem;

namespace {

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

std::string zeros(size_t n) { return std::string(n, '\0'); }

std::string st_error(const std::string& header, const std::string& data) {
  try {
    parse_safetensors("f.safetensors", le64(header.size()) + header + data);
  } catch (const ArtifactError& e) {
    return e.what();
  }
  return "(no error)";
}

HostTensor vec(const std::string& name, std::vector<double> v) {
  HostTensor t;
  t.name = name;
  t.shape = {static_cast<int64_t>(v.size())};
  t.held = std::move(v);
  return t;
}

}  // namespace

// (4) nlohmann kept the last of two entries with one name.
TEST(StrictSafetensors, RejectsATensorNamedTwice) {
  EXPECT_EQ(st_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                     R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                     zeros(8)),
            "f.safetensors: tensor 'a': named twice in the header (the last would silently win)");
}

// (4) Bytes between two tensors, before the first, or after the last were accepted.
TEST(StrictSafetensors, RejectsGapsAndTrailingBytes) {
  EXPECT_EQ(st_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                     zeros(12)),
            "f.safetensors: tensor 'b': data_offsets begin at 8, leaving a gap of 4 bytes after tensor 'a'");
  EXPECT_EQ(st_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", zeros(8)),
            "f.safetensors: tensor 'a': data_offsets begin at 4, leaving a gap of 4 bytes after the header");
  EXPECT_EQ(st_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", zeros(6)),
            "f.safetensors: 2 trailing bytes after the last tensor ('a'): the data section is 6 bytes, the "
            "tensors cover 4");
  EXPECT_EQ(st_error("{}", zeros(1)),
            "f.safetensors: 1 trailing bytes after the last tensor: the data section is 1 bytes, the tensors cover 0");
  // Empty tensors sit at the running offset; the writer's own files still read.
  EXPECT_EQ(st_error(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                     zeros(4)),
            "(no error)");
}

// (4) A NUL ends nlohmann's input early, so what followed it was never parsed.
TEST(StrictSafetensors, RejectsNulAndNonObjectHeaders) {
  EXPECT_EQ(
      st_error(std::string(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})") + '\0' + "garbage", zeros(4)),
      "f.safetensors: safetensors header holds a NUL byte");
  EXPECT_EQ(st_error(" {}", ""), "f.safetensors: safetensors header does not start with '{'");
}

// (13) One NaN used to be overwritten by the next finite difference: "max abs 6.94e-17".
TEST(NonFinite, CompareKeepsNaNAndCountsIt) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const TensorError e = compare_tensors(vec("w", {1.0, nan, 2.0, 3.0 + 1e-16}), vec("w", {1.0, 0.5, 2.0, 3.0}));
  EXPECT_TRUE(std::isnan(e.relative));
  EXPECT_TRUE(std::isnan(e.max_abs));
  EXPECT_EQ(e.nonfinite, 1);
  EXPECT_EQ(e.first_nonfinite, 1);
  const TensorError inf = compare_tensors(vec("w", {1.0, 2.0}), vec("w", {1.0, HUGE_VAL}));
  EXPECT_FALSE(std::isfinite(inf.relative));
  EXPECT_EQ(inf.nonfinite, 1);
}

TEST(NonFinite, ParityDetailSaysHowManyAndWhere) {
  ReferenceUpdate ref;
  ref.grads["w"] = vec("w", {0.1, 0.2, 0.3});
  BackendUpdate got;
  got.grads["w"] = vec("w", {0.1, std::nan(""), 0.3 + 1e-17});
  const CheckResult c = check_grad_parity({ref}, {got}, 1e-10);
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_EQ(c.detail,
            "worst update 0 w: rel L2 nan, max abs nan; 1 non-finite value in update 0 w, first at flat index 1 "
            "(backend nan, reference 0.2)");
  // report.json: a non-finite figure is the string "nan" / "inf" / "-inf" (format.hpp json_number).
  Report r;
  RunReport run;
  run.checks.push_back(c);
  r.runs.push_back(run);
  const auto j = nlohmann::json::parse(report_json(r));
  EXPECT_EQ(j["runs"][0]["checks"][0]["figure"], "nan");
}

// (6) estimate_memory read tp = 1 under the tp strategy as "unset" (tp = world / pp), so a
// correct `--backend tp --world 2 --tp 1` run failed memory.lower_bound.
TEST(EstimateTp, TpOfOneIsTpOfOne) {
  Spec spec;
  spec.topology = {2, 1, 1};
  const MemoryEstimate tp = estimate_for_run(spec, Sharding::TP, 0);
  const MemoryEstimate ddp = estimate_for_run(spec, Sharding::DDP, 0);
  EXPECT_EQ(tp.input.tp, 1);
  EXPECT_EQ(tp.dp, 2);
  EXPECT_EQ(tp.model_state(), ddp.model_state()) << "TP = 1 holds a full replica, as DDP does";
}

// (1) Run folders: a fresh one gets a marker and a nonce; a marked one is emptied; anything
// else is refused with the path named, and nothing is removed.
TEST(RunFolder, EmptiesOnlyFoldersGradcertMade) {
  const std::string root = test::temp_dir("gradcert_unit_runfolder", "root");
  const std::string dir = root + "/runs/a";
  const std::string n1 = prepare_run_folder(dir);
  EXPECT_EQ(n1.size(), 32u);
  EXPECT_EQ(run_folder_nonce(dir), n1);
  write_file_atomic(dir + "/manifest.json", "{}");
  const std::string n2 = prepare_run_folder(dir);
  EXPECT_NE(n1, n2);
  EXPECT_FALSE(fs::exists(dir + "/manifest.json")) << "the previous run's files are gone";

  const std::string foreign = root + "/mine";
  fs::create_directories(foreign);
  write_file_atomic(foreign + "/thesis.tex", "precious");
  try {
    prepare_run_folder(foreign);
    FAIL() << "emptied a folder gradcert did not make";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "run folder '" + foreign +
                                         "' holds files but no marker; gradcert only empties run folders it made "
                                         "(marker .gradcert-run): remove it or choose another --out");
  }
  EXPECT_TRUE(fs::exists(foreign + "/thesis.tex"));
  EXPECT_THROW(prepare_run_folder(foreign + "/thesis.tex"), std::invalid_argument);
  fs::create_directory_symlink(dir, root + "/link");
  EXPECT_THROW(prepare_run_folder(root + "/link"), std::invalid_argument);
  EXPECT_EQ(run_folder_nonce(dir), n2) << "the link's target was left alone";
}

namespace {

// What `read` throws, or "(hung)" when it did not return within 10 s (a FIFO used to block
// in open(2) for ever; the thread is left behind).
std::string error_within(std::function<void()> read) {
  auto done = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = done->get_future();
  std::thread([done, read] {
    try {
      read();
      done->set_value("(no error)");
    } catch (const ArtifactError& e) {
      done->set_value(e.what());
    }
  }).detach();
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) return "(hung)";
  return result.get();
}

// read_safetensors of `path` expecting one float64 tensor "w" of 4 values (32 bytes).
std::string read_error(const std::string& path) {
  return error_within([path] { read_safetensors(path, {{"w", {{4}, DType::Float64}}}); });
}

std::string read_text_file_error(const std::string& path) {
  return error_within([path] { read_text_file(path); });
}

}  // namespace

// (8) A FIFO hung the reader for ever; a link to /dev/zero read gigabytes; a link to a file
// outside the run folder was read and 8 of its bytes echoed (as a header length). Each is
// now refused at open/fstat, naming the file and what it is, and nothing of it is echoed.
TEST(ArtifactFiles, SpecialFilesAndLinksAreRefusedNamingTheFile) {
  const std::string dir = test::temp_dir("gradcert_unit_artifact_files", "dir");
  const std::string fifo = dir + "/u0.grads.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EQ(read_error(fifo), fifo + ": not a regular file (a FIFO)");
  EXPECT_EQ(read_text_file_error(fifo), fifo + ": not a regular file (a FIFO)");

  const std::string zero = dir + "/u0.params.safetensors";
  fs::create_symlink("/dev/zero", zero);
  EXPECT_EQ(read_error(zero), zero + ": is a symbolic link (gradcert reads only regular files inside the run folder)");

  const std::string secret = test::temp_dir("gradcert_unit_artifact_files", "outside") + "/secret";
  std::ofstream(secret) << "PASSWORD" << std::string(100, 'x');
  const std::string outside = dir + "/u1.grads.safetensors";
  fs::create_symlink(secret, outside);
  const std::string msg = read_error(outside);
  EXPECT_EQ(msg, outside + ": is a symbolic link (gradcert reads only regular files inside the run folder)");
  uint64_t as_length = 0;
  std::memcpy(&as_length, "PASSWORD", 8);
  EXPECT_EQ(msg.find(std::to_string(as_length)), std::string::npos) << msg;

  EXPECT_EQ(read_error(dir), dir + ": not a regular file (a folder)");
}

// (8) A hard link to a file outside the run folder passed O_NOFOLLOW and the regular-file
// check and was read as the run's own. A file with more than one link is refused, naming it
// and its link count, whatever reads it (tensors, JSON); with one name left it reads again.
TEST(ArtifactFiles, HardLinksAreRefusedNamingTheFile) {
  const std::string dir = test::temp_dir("gradcert_unit_artifact_files", "hard");
  const std::string secret = test::temp_dir("gradcert_unit_artifact_files", "hard_outside") + "/secret";
  std::ofstream(secret) << "PASSWORD" << std::string(100, 'x');
  const std::string why = " hard links (gradcert reads only files the run wrote: a hard link may point outside the "
                          "run folder)";
  const std::string grads = dir + "/u0.grads.safetensors";
  fs::create_hard_link(secret, grads);
  const std::string msg = read_error(grads);
  EXPECT_EQ(msg, grads + ": has 2" + why);
  uint64_t as_length = 0;
  std::memcpy(&as_length, "PASSWORD", 8);
  EXPECT_EQ(msg.find(std::to_string(as_length)), std::string::npos) << msg;
  const std::string manifest = dir + "/manifest.json";
  fs::create_hard_link(secret, manifest);
  EXPECT_EQ(read_text_file_error(manifest), manifest + ": has 3" + why);
  fs::remove(secret);
  fs::remove(grads);
  EXPECT_EQ(read_text_file_error(manifest), "(no error)");
}

// (8) A tensor file larger than its tensors and the 100 MiB header limit is refused from its
// size (fstat), before a byte is read: here a sparse 8 GiB file.
TEST(ArtifactFiles, ReadsAreCappedByTheSizeThePlanImplies) {
  const std::string path = test::temp_dir("gradcert_unit_artifact_files", "big") + "/u0.grads.safetensors";
  std::ofstream(path).close();
  fs::resize_file(path, 8ull << 30);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(read_error(path), path + ": is 8589934592 bytes, more than the " + std::to_string(8 + (100 << 20) + 32) +
                                  " bytes gradcert reads for it");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  // JSON files: at most 64 MiB.
  const std::string json_path = fs::path(path).parent_path().string() + "/manifest.json";
  std::ofstream(json_path).close();
  fs::resize_file(json_path, (64ull << 20) + 1);
  EXPECT_EQ(read_text_file_error(json_path),
            json_path + ": is 67108865 bytes, more than the 67108864 bytes gradcert reads for it");
  // The writer's own files still read.
  write_safetensors(path, {{"w", vec("w", {1, 2, 3, 4})}});
  EXPECT_EQ(read_error(path), "(no error)");
}

// (12) A full disk gave "cannot write temporary file" with no cause; every write (reports,
// run inputs, artifacts) now says why, with the path.
TEST(WriteErrors, NameThePathAndTheCause) {
  try {
    write_file("/dev/full", "report");
    FAIL() << "no error writing /dev/full";
  } catch (const ArtifactError& e) {
    EXPECT_EQ(std::string(e.what()), "/dev/full: cannot write: No space left on device");
  }
  const std::string missing = test::temp_dir("gradcert_unit_write_errors", "dir") + "/gone/report.json";
  try {
    write_file_atomic(missing, "report");
    FAIL() << "no error writing into a missing folder";
  } catch (const ArtifactError& e) {
    EXPECT_EQ(std::string(e.what()),
              missing + ".tmp." + std::to_string(::getpid()) + ": cannot open for writing: No such file or directory");
  }
}
