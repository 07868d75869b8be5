// A plain main() for a fuzz target, built with the normal compiler: feeds every file of the
// folders (or files) it is given to LLVMFuzzerTestOneInput, in name order. The CTest smoke
// (Fuzz.replay_<target>) replays the committed corpus on every run; a crash or an
// unexpected exception fails it naming the input. scripts/fuzz runs the long campaigns.
#include "conformance/fuzz/fuzz_target.hpp"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      inputs.push_back(p);
    } else {
      std::cerr << "replay: " << p << " is neither a file nor a folder\n";
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::cerr << "replay: no inputs\n";
    return 2;
  }
  for (const auto& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::cerr << "replay: " << p.string() << ": unexpected exception: " << e.what() << "\n";
      return 1;
    }
  }
  std::cout << "replay: " << inputs.size() << " inputs, no finding\n";
  return 0;
}
