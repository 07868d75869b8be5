// gradcert_io_bench: artifact write and read throughput of gradcert's safetensors writer and
// streamed reader (NOTE [streamed tensors]), a benchmark, not a test (scripts/bench --io runs it).
//   gradcert_io_bench DIR [MIB] [float64|float32|bfloat16] [TENSORS]
// Writes DIR/io.safetensors of about MIB MiB in TENSORS equal tensors (write_safetensors, as a
// rank writes its artifacts), then reads it as the checker does (read_safetensors for the
// header, then every tensor's values through read()), REPEATS times each, and prints one line
// per direction: "write|read MB/s <best> <median> bytes <n>" (1 MB = 1e6 B). The file is in
// the page cache when it is read (written just before): this measures gradcert's encoding,
// decoding and copies, not the disk.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "conformance/core/tensors.hpp"
#include "conformance/protocol/safetensors.hpp"

int main(int argc, char** argv) {
  using namespace gradcert;
  if (argc < 2) {
    std::fprintf(stderr, "usage: gradcert_io_bench DIR [MIB] [float64|float32|bfloat16] [TENSORS]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const double mib = argc > 2 ? std::atof(argv[2]) : 256;
  DType dtype = DType::Float64;
  try {
    if (argc > 3) dtype = parse_dtype(argv[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradcert_io_bench: %s\n", e.what());
    return 2;
  }
  const int tensors = argc > 4 ? std::atoi(argv[4]) : 64;
  if (!(mib > 0) || tensors < 1) {
    std::fprintf(stderr, "gradcert_io_bench: MIB must be > 0 and TENSORS >= 1\n");
    return 2;
  }
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(mib * (1 << 20) / dtype_bytes(dtype) / tensors));
  TensorMap map;
  std::map<std::string, TensorExpectation> expect;
  uint64_t seed = 88172645463325252ull;
  for (int i = 0; i < tensors; ++i) {
    HostTensor t;
    t.name = "t" + std::to_string(1000 + i);
    t.shape = {per};
    t.dtype = dtype;
    t.held.resize(static_cast<size_t>(per));
    for (double& v : t.held) {  // xorshift: values that are not all alike
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      v = static_cast<double>(seed >> 11) * 0x1.0p-53 - 0.5;
    }
    expect[t.name] = {t.shape, dtype};
    map.emplace(t.name, std::move(t));
  }
  const double bytes = static_cast<double>(per) * tensors * dtype_bytes(dtype);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/io.safetensors";
  const int repeats = 5;
  std::vector<double> w, r;
  double checksum = 0;
  for (int k = 0; k < repeats; ++k) {
    auto t0 = std::chrono::steady_clock::now();
    write_safetensors(path, map);
    auto t1 = std::chrono::steady_clock::now();
    const TensorMap back = read_safetensors(path, expect);
    for (const auto& kv : back) {
      const TensorValues v = kv.second.read();
      checksum += v[v.size() - 1];
    }
    auto t2 = std::chrono::steady_clock::now();
    w.push_back(bytes / 1e6 / std::chrono::duration<double>(t1 - t0).count());
    r.push_back(bytes / 1e6 / std::chrono::duration<double>(t2 - t1).count());
  }
  std::filesystem::remove(path);
  auto report = [&](const char* what, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    std::printf("%s MB/s %.0f %.0f bytes %.0f\n", what, v.back(), v[v.size() / 2], bytes);
  };
  report("write", w);
  report("read", r);
  std::fprintf(stderr, "(checksum %g, %s, %d tensors of %lld values, %d repeats)\n", checksum,
               dtype_name(dtype).c_str(), tensors, static_cast<long long>(per), repeats);
  return 0;
}
