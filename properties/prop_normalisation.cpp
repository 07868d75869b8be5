// Property 3: the normalisation identity, in arithmetic, through the core's own rule
// (loss_scale) and accounting (global_token_mean, mean_of_local_means).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "backends/runtime/replica.hpp"
#include "conformance/core/accounting.hpp"
#include "properties/support.hpp"

using namespace gradcert;
using namespace gradcert::props;

namespace {

struct GridTotals {
  std::vector<double> rank_S;   ///< S_r = sum_a S_{r,a}
  std::vector<int64_t> rank_n;  ///< n_r
  int64_t N = 0;
};

GridTotals totals(const LossGrid& g) {
  GridTotals t;
  for (int r = 0; r < g.ranks(); ++r) {
    t.rank_S.push_back(0);
    t.rank_n.push_back(0);
    for (int a = 0; a < g.micro(); ++a) t.rank_S[r] += g.S[r][a], t.rank_n[r] += g.n[r][a];
    t.N += t.rank_n[r];
  }
  return t;
}

/// What a DDP run optimises under rule `inject`: each (r, a) contributes
/// loss_scale(...) x S_{r,a}; ranks are then averaged (divided by D, summed).
double rank_averaged_objective(const LossGrid& g, const std::string& inject) {
  const GridTotals t = totals(g);
  double total = 0;
  for (int r = 0; r < g.ranks(); ++r)
    for (int a = 0; a < g.micro(); ++a)
      total += loss_scale(parse_mutant(inject), g.ranks(), g.micro(), t.N, g.n[r][a], t.rank_n[r]) * g.S[r][a];
  return total / g.ranks();
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max({1.0, std::abs(a), std::abs(b)}); }

}  // namespace

// sum_r sum_a D*S_{r,a}/N, averaged over the D ranks, is the global token mean sum S / N.
RC_GTEST_PROP(Normalisation, rankAveragedDTimesSOverNIsTheGlobalTokenMean, (const LossGrid& grid)) {
  const GridTotals t = totals(grid);
  const double global = global_token_mean(t.rank_S, t.rank_n);
  double direct = 0;
  for (double s : t.rank_S) direct += s;
  direct = t.N > 0 ? direct / static_cast<double>(t.N) : 0.0;
  RC_ASSERT(close(global, direct));
  RC_ASSERT(close(rank_averaged_objective(grid, ""), global));
  bool zero_cell = false;
  for (const auto& row : grid.n)
    for (auto n : row) zero_cell |= n == 0;
  RC_CLASSIFY(t.N == 0, "no targets at all");
  RC_CLASSIFY(zero_cell, "microbatch without targets");
  RC_CLASSIFY(std::count(t.rank_n.begin(), t.rank_n.end(), 0) > 0, "rank without targets");
}

// Averaging local means is the global mean when every rank has the same (non-zero) count,
// and otherwise off by exactly sum_r (n_r/N - 1/D) * m_r (m_r the rank's local mean).
RC_GTEST_PROP(Normalisation, meanOfLocalMeansDiffersByTheCountWeightedGap, (const LossGrid& grid)) {
  const GridTotals t = totals(grid);
  const double local = mean_of_local_means(t.rank_S, t.rank_n);
  RC_ASSERT(close(rank_averaged_objective(grid, "local-mean"), local));
  const bool equal_counts =
      std::all_of(t.rank_n.begin(), t.rank_n.end(), [&](int64_t n) { return n == t.rank_n[0] && n > 0; });
  const double global = global_token_mean(t.rank_S, t.rank_n);
  if (equal_counts) RC_ASSERT(close(local, global));
  if (t.N > 0 && std::all_of(t.rank_n.begin(), t.rank_n.end(), [](int64_t n) { return n > 0; })) {
    double gap = 0;
    for (int r = 0; r < grid.ranks(); ++r)
      gap += (static_cast<double>(t.rank_n[r]) / t.N - 1.0 / grid.ranks()) * (t.rank_S[r] / t.rank_n[r]);
    RC_ASSERT(close(global - local, gap));
  }
  RC_CLASSIFY(equal_counts, "equal counts");
  RC_CLASSIFY(!equal_counts && !close(local, global), "counts differ, objectives differ");
}

// Asked to falsify "averaging local means is the global mean", rapidcheck must find a
// counterexample of at most 2 ranks, and a 2 ranks x 1 microstep one must lie in it (the
// seed's 1-vs-3-targets case is one such). rapidcheck's shrinker sometimes stops at 2 x 2
// with equal microsteps (seed 13700337377826719269: rank0 [0.1/1, 0.1/1], rank1 [0/0, 0/0]),
// so the single microstep is taken from the shrunk grid here rather than expected of it.
TEST(Normalisation, localMeanFormulaIsFalsifiedWithTwoRanksAndOneMicrostep) {
  LossGrid last_failing;
  const Falsification f =
      falsify("Normalisation/localMeanFormulaIsFalsifiedWithTwoRanksAndOneMicrostep", [&](const LossGrid& grid) {
        const bool same = close(rank_averaged_objective(grid, "local-mean"), rank_averaged_objective(grid, ""));
        if (!same) last_failing = grid;  // the last failure rapidcheck sees is the shrunk one
        RC_ASSERT(same);
      });
  ASSERT_TRUE(f.falsified) << "the local-mean formula was never falsified:\n" << f.message;
  EXPECT_LE(last_failing.ranks(), 2) << f.message;
  bool one_microstep = false;
  for (int a = 0; a < last_failing.micro() && !one_microstep; ++a) {
    LossGrid slice;
    for (int r = 0; r < last_failing.ranks(); ++r) {
      slice.S.push_back({last_failing.S[r][a]});
      slice.n.push_back({last_failing.n[r][a]});
    }
    one_microstep = !close(rank_averaged_objective(slice, "local-mean"), rank_averaged_objective(slice, ""));
  }
  EXPECT_TRUE(one_microstep) << "no single microstep of the shrunk counterexample falsifies it:\n" << f.message;
  // The seed's case, through the same functions: 1 target / sum 0.2 and 3 targets / sum 3.
  LossGrid seed;
  seed.S = {{0.2}, {3.0}};
  seed.n = {{1}, {3}};
  EXPECT_FALSE(close(rank_averaged_objective(seed, "local-mean"), rank_averaged_objective(seed, "")));
}
