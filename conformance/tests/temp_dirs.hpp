// Temporary folders of a test: removed when the test passes, kept when it fails (the
// failure prints their paths). Torch-free: gradcert_unit and gradcert_tests both use it.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

namespace gradcert::test {

/// Every folder made by temp_dir() during the current test. A gtest listener (appended on
/// first use; gtest owns it) removes them when the test ends, unless the test failed, in
/// which case it prints "kept for inspection: <path>". GRADCERT_KEEP_TEST_DIRS=1 keeps all.
class TempDirs : public ::testing::EmptyTestEventListener {
 public:
  static TempDirs& instance() {
    static TempDirs* self = [] {
      auto* l = new TempDirs;
      ::testing::UnitTest::GetInstance()->listeners().Append(l);
      return l;
    }();
    return *self;
  }
  void add(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    paths_.push_back(path);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    std::vector<std::string> paths;
    {
      std::lock_guard<std::mutex> lock(mu_);
      paths.swap(paths_);
    }
    const char* keep = std::getenv("GRADCERT_KEEP_TEST_DIRS");
    const bool failed = info.result() && info.result()->Failed();
    for (const auto& p : paths) {
      if (failed || (keep && std::string(keep) == "1")) {
        std::cout << "[ kept     ] " << info.test_suite_name() << "." << info.name()
                  << (failed ? " failed; its folder is kept for inspection: " : " (GRADCERT_KEEP_TEST_DIRS=1): ") << p
                  << std::endl;
        continue;
      }
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::string> paths_;
};

/// A fresh, empty folder under the temp directory, <prefix>_<name>_<pid>, removed when the
/// current test passes (TempDirs).
inline std::string temp_dir(const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  const auto d = fs::temp_directory_path() / (prefix + "_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  TempDirs::instance().add(d.string());
  return d.string();
}

/// Registers a folder made elsewhere (mkdtemp, a fixed name) for the same clean-up.
inline std::string track_dir(const std::string& path) {
  TempDirs::instance().add(path);
  return path;
}

/// <prefix>_<pid> under the temp directory, created if missing (never emptied: a test may
/// call it for each file it writes), removed when the test passes.
inline std::string scratch_dir(const std::string& prefix) {
  namespace fs = std::filesystem;
  const auto d = fs::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return track_dir(d.string());
}

}  // namespace gradcert::test
