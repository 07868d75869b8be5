// Property 4: the gradient identity in LibTorch, float64. Ranks and microsteps are
// simulated in one process with the core's rule (loss_scale, counted_targets) and
// compared with the concatenated-batch reference.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <chrono>
#include <cstdlib>

#include "backends/runtime/replica.hpp"
#include "conformance/checks/checks.hpp"
#include "conformance/model/reference.hpp"
#include "properties/support.hpp"

using namespace gradcert;
using namespace gradcert::props;

namespace {

struct SimulatedWindow {
  int64_t N = 0;
  TensorMap grads;
};

// NOTE [simulated ranks] One model stands for every DP rank: each (rank, microstep)
// backpropagates loss_scale(...) x S_{r,a} into the same .grad, which therefore holds the
// SUM over ranks of what each rank accumulated; dividing by D is DDP's average. Each window
// starts from the reference's parameters before it, so a window's gradient is compared on
// its own. N follows ReplicaState::accumulate: summed counted_targets, and under
// stale-window-count a partial window reuses the last full window's N.
std::vector<SimulatedWindow> simulate_ranks(const Spec& spec, const Plan& plan, const std::vector<ReferenceUpdate>& ref,
                                            const std::string& inject) {
  std::vector<SimulatedWindow> out;
  int64_t last_full_N = -1;
  for (const Window& w : plan.windows) {
    const TensorMap& params = w.update == 0 ? initial_params(spec) : ref[w.update - 1].params_after;
    TinyLM model = make_model(spec.model, params, torch::kFloat64);
    std::vector<std::vector<Batch>> batches(plan.dp);
    std::vector<int64_t> rank_targets(plan.dp, 0);
    int64_t N = 0;
    for (int r = 0; r < plan.dp; ++r)
      for (int a = 0; a < plan.accum; ++a) {
        batches[r].push_back(collate(spec, w.slots[r][a].ids));
        rank_targets[r] += counted_targets(batches[r].back(), parse_mutant(inject));
      }
    for (auto n : rank_targets) N += n;
    if (inject == "stale-window-count" && w.partial && last_full_N >= 0) N = last_full_N;
    if (!w.partial) last_full_N = N;
    model->zero_grad(/*set_to_none=*/false);
    for (int r = 0; r < plan.dp; ++r)
      for (const Batch& b : batches[r]) {
        if (b.empty()) continue;
        const double scale = loss_scale(parse_mutant(inject), plan.dp, plan.accum, N, b.valid_targets, rank_targets[r]);
        (loss_sum(model, b) * scale).backward();
      }
    SimulatedWindow sim;
    sim.N = N;
    sim.grads = grads_of(model, DType::Float64);
    for (auto& [name, t] : sim.grads)
      for (auto& v : t.held) v /= plan.dp;
    out.push_back(std::move(sim));
  }
  return out;
}

/// The identity for one spec under rule `inject`: every window's simulated gradient is the
/// reference gradient within 1e-10 relative (L2, per tensor).
void gradient_identity(const Spec& spec, const std::string& inject) {
  const Plan plan = make_plan(spec);
  const auto ref = run_reference(spec, plan);
  const auto sim = simulate_ranks(spec, plan, ref, inject);
  bool partial = false, empty_rank = false, all_prompt = false, no_targets = false;
  for (size_t u = 0; u < ref.size(); ++u) {
    for (const auto& [name, expected] : ref[u].grads) {
      const TensorError e = compare_tensors(sim[u].grads.at(name), expected);
      if (!(e.relative <= 1e-10))
        RC_FAIL("update " + std::to_string(u) + " tensor " + name + ": relative error " + show_number(e.relative) +
                " > 1e-10 (N used " + std::to_string(sim[u].N) + ", reference N " +
                std::to_string(ref[u].valid_targets) + ")");
    }
    const Window& w = plan.windows[u];
    partial |= w.partial;
    no_targets |= w.valid_targets == 0;
    for (const auto& rank : w.slots) {
      bool has = false;
      for (const auto& mb : rank) {
        has |= !mb.ids.empty();
        all_prompt |= !mb.ids.empty() && mb.valid_targets == 0;
      }
      empty_rank |= !has;
    }
  }
  RC_CLASSIFY(partial, "partial window");
  RC_CLASSIFY(empty_rank, "rank without examples");
  RC_CLASSIFY(all_prompt, "all-prompt microbatch");
  RC_CLASSIFY(no_targets, "window with N = 0");
  RC_CLASSIFY(spec.batch.accum > 1, "A > 1");
  RC_CLASSIFY(spec.topology.dp > 1, "D > 1");
}

rc::Gen<Spec> gradient_spec() { return tiny_spec(4).as("spec"); }

}  // namespace

RC_GTEST_PROP(GradientIdentity, dTimesSOverNPerRankAndMicrostepReproducesTheReferenceGradient, ()) {
  gradient_identity(*gradient_spec(), "");
}

// Each wrong formula must be caught by the same property, with a shrunk counterexample.
#define GRADCERT_PLANTED(TestName, inject)                                                                             \
  TEST(GradientIdentity, TestName) {                                                                                   \
    const Falsification f =                                                                                            \
        falsify("GradientIdentity/" #TestName, [] { gradient_identity(*gradient_spec(), inject); });                   \
    EXPECT_TRUE(f.falsified) << f.message;                                                                             \
    EXPECT_NE(f.message.find("> 1e-10"), std::string::npos) << "caught by something else:\n" << f.message;             \
  }
GRADCERT_PLANTED(catchesLocalMean, "local-mean")
GRADCERT_PLANTED(catchesPerMicrostepMeanThenDivideByA, "micro-mean")
GRADCERT_PLANTED(catchesFullWindowNInPartialWindow, "stale-window-count")
GRADCERT_PLANTED(catchesExtraDivisionByA, "double-accum-division")
GRADCERT_PLANTED(catchesPadCountedAsTarget, "pad-as-target")
#undef GRADCERT_PLANTED

// NOTE [cases per minute] A fixed number of gradient-identity cases, timed. The figure is
// printed and recorded (gtest property `cases_per_minute`); a floor is enforced only when
// GRADCERT_MIN_CASES_PER_MIN is set, and otherwise reported as unchecked.
TEST(GradientIdentity, casesPerMinute) {
  int cases = 0;
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = 60;
  rc::detail::TestMetadata metadata;
  metadata.id = "GradientIdentity/casesPerMinute";
  rc::detail::TestListenerAdapter quiet;
  const auto t0 = std::chrono::steady_clock::now();
  const auto result = rc::detail::checkTestable(
      [&] {
        ++cases;
        gradient_identity(*gradient_spec(), "");
      },
      metadata, params, quiet, rc::detail::configuration().reproduce);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(result.is<rc::detail::SuccessResult>());
  const double per_min = cases / secs * 60.0;
  RecordProperty("cases_per_minute", std::to_string(per_min));
  const char* floor = std::getenv("GRADCERT_MIN_CASES_PER_MIN");
  std::cout << "gradient-identity cases: " << cases << " in " << secs << " s = " << per_min << " cases/min (floor "
            << (floor ? floor : "unchecked") << ")" << std::endl;
  if (floor) EXPECT_GE(per_min, std::atof(floor));
}
