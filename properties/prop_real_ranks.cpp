// Property 5: the real ddp backend over c10d Gloo, ranks as threads of this process, on
// random small specs, against the float64 reference.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <future>

#include "backends/catalog.hpp"
#include "conformance/launch/store.hpp"
#include "conformance/run/rank_store.hpp"
#include "conformance/checks/checks.hpp"
#include "conformance/model/reference.hpp"
#include "properties/support.hpp"

using namespace gradcert;
using namespace gradcert::props;

namespace {

constexpr double kCollectiveTimeoutS = 30;

// NOTE [one process group per test] Rendezvous costs far more than a tiny case, so each
// test builds its group once: one rendezvous store (NOTE [rank store]) served by the test, one
// ProcessGroupGloo per rank thread, built concurrently because Gloo's rendezvous blocks
// until every rank arrives. Every collective times out after 30 s, so a bug fails the
// case instead of hanging it. (Same construction as conformance/run/worker.cpp.)
class GlooGroup {
 public:
  explicit GlooGroup(int world) : world_(world) {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(kCollectiveTimeoutS * 1000));
    std::vector<std::future<c10::intrusive_ptr<c10d::Backend>>> made;
    for (int r = 0; r < world; ++r)
      made.push_back(std::async(std::launch::async, [=] {
        auto store = connect_rank_store(store_.address(), timeout);
        auto pg_opts = c10d::ProcessGroupGloo::Options::create(timeout);
        pg_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        return c10::intrusive_ptr<c10d::Backend>(c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, world, pg_opts));
      }));
    for (auto& f : made) groups_.push_back(f.get());
  }
  int world() const { return world_; }

  /// Runs every window of `spec` on all ranks with the ddp backend; rank 0's updates.
  std::vector<BackendUpdate> run_ddp(const Spec& spec, const Plan& plan, const std::string& inject) {
    std::vector<std::future<std::vector<RankUpdate>>> ranks;
    for (int r = 0; r < world_; ++r)
      ranks.push_back(std::async(std::launch::async, [&, r] {
        torch::set_num_threads(1);
        auto backend = make_backend("ddp");
        backend->validate(plan, world_, parse_mutant(inject));
        RankContext ctx;
        ctx.spec = &spec;
        ctx.plan = &plan;
        ctx.rank = r;
        ctx.world = world_;
        ctx.pg = groups_[r];
        ctx.mutant = parse_mutant(inject);
        backend->setup(ctx);
        std::vector<RankUpdate> out;
        for (const auto& w : plan.windows) out.push_back(backend->run_update(ctx, w.update));
        return out;
      }));
    std::vector<std::vector<RankUpdate>> results;
    std::string errors;
    for (int r = 0; r < world_; ++r) try {
        results.push_back(ranks[r].get());
      } catch (const std::exception& e) {
        errors += "rank " + std::to_string(r) + ": " + e.what() + "\n";
      }
    if (!errors.empty()) throw std::runtime_error(errors);
    std::vector<BackendUpdate> run;
    for (auto& u : results[0]) {
      BackendUpdate b;
      b.update = u.record.update;
      b.loss = u.loss;
      b.valid_targets = u.valid_targets;
      b.grads = std::move(u.grads);
      b.params_after = std::move(u.params_after);
      run.push_back(std::move(b));
    }
    return run;
  }

 private:
  int world_;
  StoreServer store_;  // outlives the groups built on it
  std::vector<c10::intrusive_ptr<c10d::Backend>> groups_;
};

/// A tiny spec for `world` DP ranks (ddp: TP = PP = 1).
Spec real_rank_spec(int world) {
  Spec spec = *tiny_spec(1).as("spec (D set to the world)");
  spec.topology.dp = world;
  const int update_batch = spec.batch.micro * spec.batch.accum * world;
  spec.dataset.size = std::min(spec.dataset.size * world, 2 * update_batch + update_batch / 2 + 1);
  spec.timeout.collective_s = kCollectiveTimeoutS;
  return spec;
}

/// The ddp backend on real ranks reproduces the reference: N, global-mean loss, gradients
/// and parameters after the step, every window, within the spec's float64 tolerance.
void ddp_matches_reference(GlooGroup& group, const std::string& inject) {
  const Spec spec = real_rank_spec(group.world());
  RC_LOG() << "spec run on " << group.world() << " ranks: " << rc::toString(spec) << "\n";
  const Plan plan = make_plan(spec);
  const auto ref = run_reference(spec, plan);
  std::vector<BackendUpdate> run;
  try {
    run = group.run_ddp(spec, plan, inject);
  } catch (const std::exception& e) {
    RC_FAIL(std::string("ranks failed: ") + e.what());
  }
  const double tol = spec.parity_tolerance();
  for (const CheckResult& c : {check_window_count(ref, run), check_global_mean_loss(ref, run, tol),
                               check_grad_parity(ref, run, tol), check_params_parity(ref, run, tol)})
    if (c.verdict != Verdict::Pass)
      RC_FAIL(c.id + ": " + show_number(c.figure) + " > " + show_number(c.tolerance) + " (" + c.detail + ")");
  bool partial = false, empty_rank = false;
  for (const auto& w : plan.windows) {
    partial |= w.partial;
    for (const auto& rank : w.slots) empty_rank |= rank[0].ids.empty();
  }
  RC_CLASSIFY(partial, "partial window");
  RC_CLASSIFY(empty_rank, "rank without examples");
  RC_CLASSIFY(spec.batch.accum > 1, "A > 1");
}

}  // namespace

// The group lives for the whole test (all cases); rapidcheck runs inside the TEST body,
// exactly as RC_GTEST_PROP would, so RC_PARAMS and reproduce work by the same id.
TEST(RealRanks, ddpOverGlooWorld2MatchesTheReference) {
  GlooGroup group(2);
  rc::detail::checkGTest([&] { ddp_matches_reference(group, ""); });
}

TEST(RealRanks, ddpOverGlooWorld3MatchesTheReference) {
  GlooGroup group(3);
  rc::detail::checkGTest([&] { ddp_matches_reference(group, ""); });
}

TEST(RealRanks, ddpOverGlooCatchesPlantedLocalMean) {
  GlooGroup group(2);
  const Falsification f =
      falsify("RealRanks/ddpOverGlooCatchesPlantedLocalMean", [&] { ddp_matches_reference(group, "local-mean"); });
  EXPECT_TRUE(f.falsified) << f.message;
  // Caught by a check, not by ranks that crashed or timed out.
  EXPECT_EQ(f.message.find("ranks failed"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("parity"), std::string::npos) << f.message;
}
