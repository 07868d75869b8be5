// The GPU path of the built-in strategies (NOTE [compute device], NOTE [collectives on a device]):
// every strategy of the catalog on `--device cuda`, its checks against the float64 reference on
// the CPU, and its memory phases from the CUDA caching allocator. `ctest -L gpu`; without a CUDA
// device each case is a CTest skip whose output names why (the probe's reason).
#include <gtest/gtest.h>

#include <string>

#include "backends/catalog.hpp"
#include "conformance/launch/cuda_probe.hpp"
#include "conformance/run/harness.hpp"
#include "conformance/tests/support.hpp"

using namespace gradcert;

namespace {

struct GpuCase {
  const StrategyInfo* strategy;
  DType dtype;
};

std::string gpu_case_name(const testing::TestParamInfo<GpuCase>& info) {
  return info.param.strategy->name + "_" + dtype_name(info.param.dtype);
}

void PrintTo(const GpuCase& c, std::ostream* os) { *os << gpu_case_name({c, 0}); }

std::vector<GpuCase> gpu_cases() {
  std::vector<GpuCase> out;
  for (const auto* s : strategies())
    for (DType d : {DType::Float64, DType::Float32}) out.push_back({s, d});
  return out;
}

class Gpu : public testing::TestWithParam<GpuCase> {};

}  // namespace

// The strategy at its certify topology (primary world; where the machine has fewer GPUs than
// ranks, the ranks share them over Gloo, as NCCL refuses two ranks on one GPU), three
// microsteps per update, AdamW, a partial final window.
TEST_P(Gpu, StrategyOnCudaPassesEveryCheckWithCudaMemoryPhases) {
  const CudaProbe probe = probe_cuda();
  if (probe.count == 0) GTEST_SKIP() << "no CUDA device: " << probe.reason;
  const StrategyInfo& s = *GetParam().strategy;
  const CertifyTopology& t = s.primary;
  RunRequest r;
  r.backend = s.name;
  r.world = t.world;
  r.tp = t.tp;
  r.pp = t.pp;
  r.spec.device = "cuda";
  r.spec.dtype = GetParam().dtype;
  r.spec.batch.accum = 3;
  r.spec.optimizer.name = "adamw";
  r.spec.topology = {t.world / (t.tp * t.pp), t.tp, t.pp};
  r.spec.dataset.size = static_cast<int>(2 * update_batch_size(r.spec.batch.micro, 3, r.spec.topology.dp) + 1);
  r.spec.timeout.run_s = 600;
  r.exe = GRADCERT_EXE;
  r.run_dir = test::fresh_dir("gradcert_gpu", gpu_case_name({GetParam(), 0}));
  const RunReport rep = run_backend(r);
  ASSERT_TRUE(rep.error.empty()) << rep.error;
  EXPECT_TRUE(rep.passed()) << test::failures(rep);
  for (const auto& c : rep.checks) {
    if (c.id == "grad.parity") {
      std::cout << s.name << " on cuda (" << device_summary(r.spec, t.world, true) << "), " << dtype_name(r.spec.dtype)
                << ": grad.parity " << c.figure << " (tolerance " << c.tolerance << ")\n";
      if (r.spec.dtype == DType::Float64) EXPECT_LE(c.figure, 1e-10);
    }
  }
  ASSERT_TRUE(rep.has_memory);
  ASSERT_FALSE(rep.memory.peaks.empty()) << "no memory phases measured";
  for (const auto& p : rep.memory.peaks) {
    EXPECT_EQ(p.device.rfind("cuda:", 0), 0u) << "rank " << p.rank << " phase " << p.phase << " measured " << p.device;
    EXPECT_GT(p.peak_bytes, 0) << "rank " << p.rank << " phase " << p.phase;
    std::cout << "  rank " << p.rank << " " << p.bucket << " " << p.phase << " on " << p.device << ": allocated peak "
              << p.peak_bytes << " B, reserved peak " << p.reserved_peak_bytes << " B, " << p.seconds << " s\n";
  }
}

INSTANTIATE_TEST_SUITE_P(GpuStrategies, Gpu, testing::ValuesIn(gpu_cases()), gpu_case_name);
