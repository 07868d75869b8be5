#include "properties/support.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <unordered_map>

namespace rc::detail {
// Defined in librapidcheck (src/detail/Serialization.cpp); not declared in its headers.
std::string reproduceMapToString(const std::unordered_map<std::string, Reproduce>& reproduceMap);
}  // namespace rc::detail

namespace gradcert::props {

std::string reproduce_line(const std::string& id, const rc::detail::Reproduce& reproduce) {
  const auto dot = id.find('/');
  const std::string filter = dot == std::string::npos ? id : id.substr(0, dot) + "." + id.substr(dot + 1);
  return "reproduce: RC_PARAMS=\"reproduce=" + rc::detail::reproduceMapToString({{id, reproduce}}) +
         "\" gradcert_properties --gtest_filter=" + filter;
}

uint64_t rapidcheck_seed() { return rc::detail::configuration().testParams.seed; }

namespace {

// NOTE [seed in every report] Each property process prints the seed on stdout and records
// it as a test-suite property (gtest XML / JUnit: `rapidcheck_seed`). A failure also ends
// with rapidcheck's `RC_PARAMS="reproduce=..."` line, which replays that exact case.
class SeedEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    torch::set_num_threads(1);
    const auto& config = rc::detail::configuration();
    std::cout << "gradcert properties: rapidcheck seed=" << config.testParams.seed
              << " max_success=" << config.testParams.maxSuccess
              << " (rerun with RC_PARAMS=\"seed=" << config.testParams.seed << "\")" << std::endl;
    ::testing::Test::RecordProperty("rapidcheck_seed", std::to_string(config.testParams.seed));
    ::testing::Test::RecordProperty("rapidcheck_max_success", config.testParams.maxSuccess);
  }
};

const auto* const seed_environment = ::testing::AddGlobalTestEnvironment(new SeedEnvironment);

}  // namespace

rc::Gen<Spec> tiny_spec(int max_dp) {
  return rc::gen::map(rc::gen::tuple(rc::gen::inRange(1, max_dp + 1).as("D"), rc::gen::arbitrary<EpochShape>(),
                                     rc::gen::arbitrary<DatasetSpec>(), rc::gen::inRange(1, 3).as("layers"),
                                     rc::gen::inRange<int>(0, 1 << 20).as("data seed")),
                      [](const std::tuple<int, EpochShape, DatasetSpec, int, int>& t) {
                        const auto& [dp, epoch, dataset, layers, seed] = t;
                        Spec s;
                        s.seed = static_cast<uint64_t>(seed);
                        s.model = tiny_model(layers);
                        s.dataset = dataset;
                        s.batch = epoch.batch;
                        s.topology.dp = dp;
                        const int update_batch = epoch.batch.micro * epoch.batch.accum * dp;
                        s.dataset.size =
                            std::max(1, epoch.full_windows * update_batch + epoch.remainder % update_batch);
                        s.updates = 0;
                        s.dtype = DType::Float64;
                        return s;
                      });
}

}  // namespace gradcert::props

namespace gradcert {

void showValue(const TopologySpec& t, std::ostream& os) {
  os << "D=" << t.dp << " TP=" << t.tp << " PP=" << t.pp << " (world " << t.world() << ")";
}
void showValue(const BatchSpec& b, std::ostream& os) { os << "B_micro=" << b.micro << " A=" << b.accum; }
void showValue(const DatasetSpec& d, std::ostream& os) {
  os << "size=" << d.size << " lengths short[" << d.short_min << "," << d.short_max << "] typical[" << d.typical_min
     << "," << d.typical_max << "] long[" << d.long_min << "," << d.long_max << "] shares short=" << d.short_share
     << " long=" << d.long_share << " prompt=" << d.prompt_share << " all_prompt=" << d.all_prompt_share
     << (d.shuffle ? " shuffled" : "");
}
void showValue(const Spec& s, std::ostream& os) {
  os << "spec{seed=" << s.seed << " ";
  showValue(s.topology, os);
  os << " ";
  showValue(s.batch, os);
  os << " layers=" << s.model.layers << " dataset{";
  showValue(s.dataset, os);
  os << "} updates=" << s.updates << " dtype=" << dtype_name(s.dtype) << "}";
}

namespace props {
void showValue(const LossGrid& g, std::ostream& os) {
  os << g.ranks() << " ranks x " << g.micro() << " microsteps:";
  for (int r = 0; r < g.ranks(); ++r) {
    os << " rank" << r << "[";
    for (int a = 0; a < g.micro(); ++a) os << (a ? " " : "") << "S=" << g.S[r][a] << "/n=" << g.n[r][a];
    os << "]";
  }
}
void showValue(const EpochShape& e, std::ostream& os) {
  os << "B_micro=" << e.batch.micro << " A=" << e.batch.accum << " full windows=" << e.full_windows
     << " remainder=" << e.remainder << " (mod B_update)";
}
}  // namespace props

}  // namespace gradcert
