// Unit tests: each strategy's collective sequence, pinned in one process by running one
// rank at a time with RecordingBackend (conformance/tests/recording_pg.hpp, the test double beside its tests) as its process
// groups. A recording group completes every call at once as a world of identical ranks
// would (SUM all-reduce: input x size, recv: zeros), so a rank's control flow is the one
// a real run takes, and what it issues can be compared across ranks without a launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "backends/catalog.hpp"
#include "backends/runtime/flat.hpp"
#include "backends/runtime/mutants.hpp"
#include "conformance/tests/recording_pg.hpp"
#include "backends/runtime/strategy.hpp"
#include "conformance/core/plan.hpp"
#include "conformance/core/topology.hpp"
#include "conformance/model/model.hpp"

using namespace gradcert;

namespace {

/// What one rank issued in one update, per group (empty where the rank has no such group).
struct UpdateLog {
  std::vector<RecordedOp> pg, dp, tp;
  RankUpdate out;
};

/// One rank of a run: the backend and its recording groups, as make_process_groups would
/// make them (pg over the world; dp_pg only when 1 < D < world, at D == world dp_group()
/// falls back to pg; tp_pg only when TP > 1).
struct RankRun {
  std::unique_ptr<Backend> backend;
  std::vector<UpdateLog> updates;  ///< updates 0..n-1, in order (state carries over)
};

RankRun run_rank(const std::string& name, const Spec& spec, const Plan& plan, int rank, int updates,
                 const std::string& inject = "") {
  RankRun run;
  const Mutant mutant = parse_mutant(inject);
  run.backend = make_backend(name);
  run.backend->validate(plan, plan.world(), mutant);
  run.backend->validate_model(spec.model, plan);
  const Coords c = coords_of(plan, rank);
  c10::intrusive_ptr<RecordingBackend> pg, dp, tp;
  if (plan.world() > 1) pg = c10::make_intrusive<RecordingBackend>(rank, plan.world(), "pg");
  if (plan.dp > 1 && plan.dp < plan.world()) dp = c10::make_intrusive<RecordingBackend>(c.dp, plan.dp, "dp");
  if (plan.tp > 1) tp = c10::make_intrusive<RecordingBackend>(c.tp, plan.tp, "tp");
  RankContext ctx;
  ctx.spec = &spec;
  ctx.plan = &plan;
  ctx.rank = rank;
  ctx.world = plan.world();
  ctx.mutant = mutant;
  ctx.pg = pg;
  ctx.dp_pg = dp;
  ctx.tp_pg = tp;
  run.backend->setup(ctx);
  for (int u = 0; u < updates; ++u) {
    for (auto* g : {pg.get(), dp.get(), tp.get()})
      if (g) g->clear();
    UpdateLog log;
    log.out = run.backend->run_update(ctx, u);
    if (pg) log.pg = pg->ops();
    if (dp) log.dp = dp->ops();
    if (tp) log.tp = tp->ops();
    run.updates.push_back(std::move(log));
  }
  return run;
}

Spec spec_for(int dp, int tp, int pp) {
  Spec s;  // defaults: 2 layers, d_model 16, d_ff 32, 26 examples, B_micro 2, A 3
  s.topology = {dp, tp, pp};
  return s;
}

int64_t param_count(const Spec& spec) { return FlatLayout::of(initial_params(spec)).total; }

std::string str(int64_t x) { return std::to_string(x); }
std::string allreduce(int64_t n) { return "allreduce SUM " + str(n) + "\n"; }
std::string gather(int64_t n) { return "allgather_base " + str(n) + "\n"; }
std::string reduce_scatter(int64_t n) { return "reduce_scatter_base SUM " + str(n) + "\n"; }

int count(const std::vector<RecordedOp>& ops, const std::string& op) {
  return static_cast<int>(std::count_if(ops.begin(), ops.end(), [&](const RecordedOp& o) { return o.op == op; }));
}

bool is_p2p(const RecordedOp& o) { return o.op == "send" || o.op == "recv"; }

/// The collectives of a log without point-to-point ops, as text.
std::string collectives_text(const std::vector<RecordedOp>& ops) {
  std::vector<RecordedOp> c;
  for (const auto& o : ops)
    if (!is_p2p(o)) c.push_back(o);
  return ops_text(c);
}

/// Activation elements of the microbatch of DP rank r at microstep a (0 when empty).
int64_t activation_numel(const Spec& spec, const Plan& plan, int update, int r, int a) {
  const Batch b = collate(spec, plan.windows[update].slots[r][a].ids);
  return b.empty() ? 0 : b.input.size(0) * b.input.size(1) * spec.model.d_model;
}

/// Every rank's p2p traffic on pg must pair up in order: the sends from s to d (tag, numel)
/// are, one for one, the receives d posts from s. Returns the first mismatch per channel.
std::string unpaired_p2p(const std::vector<std::vector<RecordedOp>>& pg_by_rank) {
  using Msgs = std::vector<std::pair<int, int64_t>>;              // (tag, numel) in issue order
  std::map<std::pair<int, int>, std::pair<Msgs, Msgs>> channels;  // (src, dst) -> (sent, received)
  for (int r = 0; r < static_cast<int>(pg_by_rank.size()); ++r)
    for (const auto& o : pg_by_rank[r]) {
      if (o.op == "send") channels[{r, o.peer}].first.push_back({o.tag, o.numel});
      if (o.op == "recv") channels[{o.peer, r}].second.push_back({o.tag, o.numel});
    }
  auto msg = [](const Msgs& m, size_t i) {
    return i < m.size() ? "tag " + str(m[i].first) + " numel " + str(m[i].second) : std::string("nothing");
  };
  std::string bad;
  for (const auto& [ch, io] : channels) {
    const auto& [sent, received] = io;
    for (size_t i = 0; i < std::max(sent.size(), received.size()); ++i)
      if (i >= sent.size() || i >= received.size() || sent[i] != received[i]) {
        bad += str(ch.first) + "->" + str(ch.second) + " message " + str(i) + ": sent " + msg(sent, i) + ", received " +
               msg(received, i) + "\n";
        break;
      }
  }
  return bad;
}

/// FSDP units in forward order (embed, blocks.<i>, head) and their sizes, from the
/// canonical names: a unit is contiguous in the flat layout (NOTE [flat layout]).
struct UnitRange {
  std::string name;
  int64_t begin = 0, numel = 0;
};
std::vector<UnitRange> fsdp_units(const Spec& spec) {
  auto unit = [](const std::string& p) {
    if (p.rfind("blocks.", 0) == 0) return p.substr(0, p.find('.', 7));
    return std::string(p.rfind("wte", 0) == 0 || p.rfind("wpe", 0) == 0 ? "embed" : "head");
  };
  std::map<std::string, UnitRange> by;
  for (const auto& e : FlatLayout::of(initial_params(spec)).entries) {
    auto& u = by[unit(e.name)];
    if (u.numel == 0) u = {unit(e.name), e.offset, 0};
    u.begin = std::min(u.begin, e.offset);
    u.numel += e.numel;
  }
  std::vector<UnitRange> out{by.at("embed")};
  for (int i = 0; i < spec.model.layers; ++i) out.push_back(by.at("blocks." + str(i)));
  out.push_back(by.at("head"));
  return out;
}

/// The flat gradient DP rank r must hold after update 0 when its peers are recordings,
/// computed here with the plain model. Recorded peers are identical to it: N = D * n_r, so the
/// D*S/N rule backpropagates S_{r,a} / n_r, and a SUM reduce-scatter of grad / D over D
/// identical ranks returns grad. A recorded all-gather hands back this rank's own shard in
/// every slot, so within each of `gathered` (flat ranges all-gathered before the forward:
/// zero3 all of it, fsdp each unit) the weights are rank r's shard, repeated.
torch::Tensor identical_ranks_gradient(const Spec& spec, const Plan& plan, int r,
                                       const std::vector<UnitRange>& gathered) {
  TensorMap params = initial_params(spec);
  const FlatLayout layout = FlatLayout::of(params);
  std::vector<double> flat;
  for (const auto& e : layout.entries)
    flat.insert(flat.end(), params.at(e.name).held.begin(), params.at(e.name).held.end());
  std::vector<double> seen = flat;
  for (const auto& g : gathered) {
    const int64_t s = (g.numel + plan.dp - 1) / plan.dp;
    for (int64_t i = 0; i < g.numel; ++i)
      seen[g.begin + i] = r * s + i % s < g.numel ? flat[g.begin + r * s + i % s] : 0.0;  // padded tail: 0
  }
  for (const auto& e : layout.entries)
    params.at(e.name).held.assign(seen.begin() + e.offset, seen.begin() + e.offset + e.numel);
  TinyLM model = make_model(spec.model, params, torch::kFloat64);
  std::vector<Batch> batches;
  int64_t n_r = 0;
  for (int a = 0; a < plan.accum; ++a) {
    batches.push_back(collate(spec, plan.windows[0].slots[r][a].ids));
    n_r += batches.back().valid_targets;
  }
  for (auto& b : batches)
    if (!b.empty()) (loss_sum(model, b) / static_cast<double>(n_r)).backward();
  std::map<std::string, torch::Tensor> grads;
  for (auto& p : model->named_parameters()) grads[p.key()] = p.value().grad().reshape({-1});
  std::vector<torch::Tensor> parts;
  for (const auto& e : layout.entries) parts.push_back(grads.at(e.name));
  return torch::cat(parts);
}

torch::Tensor state(Backend& b, const std::string& name) {
  for (auto& [n, t] : b.state_tensors())
    if (n == name) return t;
  ADD_FAILURE() << "no state tensor " << name;
  return torch::zeros({0}, torch::kFloat64);
}

/// A gradient shard against its expected value, with the ratio where it is not zero.
void expect_shard(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const auto nz = want.abs() > 1e-12;
  const auto ratio = got.masked_select(nz) / want.masked_select(nz);
  EXPECT_TRUE(torch::allclose(got, want, 1e-10, 1e-14))
      << what << ": shard / expected in [" << ratio.min().item<double>() << ", " << ratio.max().item<double>() << "]";
}

}  // namespace

/// One intra-op thread while a test runs, as each rank process has (worker.cpp): the models
/// are tiny, and spare threads that wait on a busy core slow these tests down 20-fold.
class Collectives : public testing::Test {
 protected:
  void SetUp() override {
    threads_ = torch::get_num_threads();
    torch::set_num_threads(1);
  }
  void TearDown() override { torch::set_num_threads(threads_); }

 private:
  int threads_ = 1;
};

// ---- ddp ------------------------------------------------------------------------------------

// ddp at D = world = 2: N, the loss, then ONE flat gradient all-reduce per window (no sync on
// earlier microsteps), on every update; artifacts are taken locally (no collective).
TEST_F(Collectives, DdpIssuesOneFlatGradientAllreducePerWindow) {
  const Spec spec = spec_for(2, 1, 1);
  const Plan plan = make_plan(spec);
  const int W = static_cast<int>(plan.windows.size());
  for (int r = 0; r < 2; ++r) {
    const auto run = run_rank("ddp", spec, plan, r, W);
    for (int u = 0; u < W; ++u)
      EXPECT_EQ(ops_text(run.updates[u].pg), allreduce(2) + allreduce(2) + allreduce(param_count(spec)))
          << "rank " << r << " update " << u;
  }
}

// The planted missing-final-sync bug shows in the sequence alone: N and the loss, and no
// gradient all-reduce (nothing of the parameters' size) on any rank or update.
TEST_F(Collectives, DdpMissingFinalSyncIssuesNoGradientAllreduce) {
  const Spec spec = spec_for(2, 1, 1);
  const Plan plan = make_plan(spec);
  const int W = static_cast<int>(plan.windows.size());
  for (int r = 0; r < 2; ++r) {
    const auto run = run_rank("ddp", spec, plan, r, W, "missing-final-sync");
    for (int u = 0; u < W; ++u) {
      const auto& ops = run.updates[u].pg;
      EXPECT_EQ(ops_text(ops), allreduce(2) + allreduce(2)) << "rank " << r << " update " << u;
    }
  }
}

// ---- ZeRO -----------------------------------------------------------------------------------

// zero1 all-reduces the full gradient, zero2 / zero3 reduce-scatter the padded flat gradient;
// all gather the updated shards (zero3 before the forward instead of after the step). The
// artifacts add no collective: each rank writes its own shards (NOTE [shard artifacts]).
TEST_F(Collectives, ZeroStagesShardGradientsAndGatherParameters) {
  const Spec spec = spec_for(2, 1, 1);
  const Plan plan = make_plan(spec);
  const int64_t P = param_count(spec), shard = (P + 1) / 2;
  const std::string head = allreduce(2) + allreduce(2), tail;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ops_text(run_rank("zero1", spec, plan, r, 1).updates[0].pg), head + allreduce(P) + gather(shard) + tail);
    EXPECT_EQ(ops_text(run_rank("zero2", spec, plan, r, 1).updates[0].pg),
              head + reduce_scatter(2 * shard) + gather(shard) + tail);
    EXPECT_EQ(ops_text(run_rank("zero3", spec, plan, r, 1).updates[0].pg),
              gather(shard) + head + reduce_scatter(2 * shard) + tail);
  }
}

// The reduce-scatter divisor, seen in the values: each rank's gradient shard must equal
// its slice of identical_ranks_gradient (zero2, zero3 and every fsdp unit), at D = 2 and 4,
// for the first and the last rank. The planted divided-by-d-twice divides by D twice: its
// shards are that gradient / D.
TEST_F(Collectives, ZeroAndFsdpReduceScatterDivideByD) {
  for (int D : {2, 4}) {
    const Spec spec = spec_for(D, 1, 1);
    const Plan plan = make_plan(spec);
    const auto units = fsdp_units(spec);
    const int64_t P = param_count(spec), shard = (P + D - 1) / D;
    for (int r : {0, D - 1}) {
      const torch::Tensor zero2 = identical_ranks_gradient(spec, plan, r, {}),
                          zero3 = identical_ranks_gradient(spec, plan, r, {UnitRange{"all", 0, P}}),
                          fsdp = identical_ranks_gradient(spec, plan, r, units);
      ASSERT_GT(zero2.abs().max().item<double>(), 0);
      for (const std::string inject : {"", "divided-by-d-twice"}) {
        const double factor = inject.empty() ? 1.0 : 1.0 / D;
        SCOPED_TRACE("D " + str(D) + " rank " + str(r) + " inject '" + inject + "'");
        const int64_t lo = std::min(P, r * shard), hi = std::min(P, lo + shard);
        for (const auto& [name, g] : {std::make_pair("zero2", zero2), std::make_pair("zero3", zero3)}) {
          auto run = run_rank(name, spec, plan, r, 1, inject);
          const auto got = state(*run.backend, "grad.shard").slice(0, 0, hi - lo), want = g.slice(0, lo, hi) * factor;
          expect_shard(got, want, name);
        }
        auto run = run_rank("fsdp", spec, plan, r, 1, inject);
        for (const auto& u : units) {
          const int64_t us = (u.numel + D - 1) / D, ulo = std::min(u.numel, r * us), uhi = std::min(u.numel, ulo + us);
          const auto got = state(*run.backend, "grad." + u.name + ".shard").slice(0, 0, uhi - ulo);
          const auto want = fsdp.slice(0, u.begin + ulo, u.begin + uhi) * factor;
          expect_shard(got, want, "fsdp unit " + u.name);
        }
      }
    }
  }
}

// ---- FSDP -----------------------------------------------------------------------------------

// fsdp, every microstep (empty ones too): forward gathers of units 0..U-2 (the head's forward
// runs inside its backward), then per unit in reverse: gather, then reduce-scatter of that
// same unit. Exact sizes: a gather contributes the unit's shard, a reduce-scatter D shards.
TEST_F(Collectives, FsdpGathersThenReduceScattersEachUnitInReverse) {
  const Spec spec = spec_for(2, 1, 1);
  const Plan plan = make_plan(spec);
  const auto units = fsdp_units(spec);
  const int D = plan.dp, U = static_cast<int>(units.size());
  ASSERT_EQ(U, spec.model.layers + 2);
  auto shard = [&](int k) { return (units[k].numel + D - 1) / D; };
  std::string micro;
  for (int k = 0; k + 1 < U; ++k) micro += gather(shard(k));
  for (int k = U - 1; k >= 0; --k) micro += gather(shard(k)) + reduce_scatter(D * shard(k));
  std::string want = allreduce(2);
  for (int a = 0; a < plan.accum; ++a) want += micro;
  want += allreduce(2);  // the loss; the artifacts are shards, gathered by nobody (NOTE [shard artifacts])
  const int last = static_cast<int>(plan.windows.size()) - 1;
  for (int r = 0; r < D; ++r) {
    const auto run = run_rank("fsdp", spec, plan, r, last + 1);
    EXPECT_EQ(ops_text(run.updates[0].pg), want) << "rank " << r << " update 0";
    EXPECT_EQ(ops_text(run.updates[last].pg), want) << "rank " << r << " partial update " << last;
  }
}

// stale-gathered-params keeps update 0's gathered weights: it gathers as the correct backend
// does on update 0 and never again, while every other collective stays as it was.
TEST_F(Collectives, StaleGatheredParamsIssuesNoGatherAfterUpdateZero) {
  const Spec spec = spec_for(2, 1, 1);
  const Plan plan = make_plan(spec);
  const int W = static_cast<int>(plan.windows.size());
  ASSERT_GE(W, 3);
  auto without_gathers = [](std::vector<RecordedOp> ops) {
    ops.erase(std::remove_if(ops.begin(), ops.end(), [](const RecordedOp& o) { return o.op == "allgather_base"; }),
              ops.end());
    return ops_text(ops);
  };
  for (const std::string b : {"zero3", "fsdp"}) {
    const auto good = run_rank(b, spec, plan, 1, W), stale = run_rank(b, spec, plan, 1, W, "stale-gathered-params");
    EXPECT_EQ(ops_text(stale.updates[0].pg), ops_text(good.updates[0].pg)) << b;
    for (int u = 1; u < W; ++u) {
      EXPECT_GT(count(good.updates[u].pg, "allgather_base"), 0) << b << " update " << u;
      EXPECT_EQ(count(stale.updates[u].pg, "allgather_base"), 0) << b << " update " << u << "\n"
                                                                 << ops_text(stale.updates[u].pg);
      EXPECT_EQ(without_gathers(stale.updates[u].pg), without_gathers(good.updates[u].pg)) << b << " update " << u;
    }
  }
}

// ---- pipeline -------------------------------------------------------------------------------

// pp at PP = 2 (1F1B), exact: stage 0 sends microbatch a's activation (tag 2a) and receives
// its gradient (tag 2a + 1) one microbatch behind; stage 1 receives, then sends back. Then
// the loss over the world (no DP group at D = 1); each stage writes its own tensors as shard
// artifacts, with no collective (NOTE [shard artifacts]).
TEST_F(Collectives, PpOneFOneBSequenceAtTwoStages) {
  const Spec spec = spec_for(1, 1, 2);
  const Plan plan = make_plan(spec);
  std::vector<int> micro;
  for (int a = 0; a < plan.accum; ++a)
    if (!plan.windows[0].slots[0][a].ids.empty()) micro.push_back(a);
  ASSERT_GE(micro.size(), 2u);
  auto p2p = [&](const std::string& op, int peer, int a, int backward) {
    return op + (op == "send" ? " ->" : " <-") + str(peer) + " tag " + str(2 * a + backward) + " " +
           str(activation_numel(spec, plan, 0, 0, a)) + "\n";
  };
  std::string stage0, stage1;
  for (size_t i = 0; i < micro.size(); ++i) {
    stage0 += p2p("send", 1, micro[i], 0);
    if (i > 0) stage0 += p2p("recv", 1, micro[i - 1], 1);
    stage1 += p2p("recv", 0, micro[i], 0) + p2p("send", 0, micro[i], 1);
  }
  stage0 += p2p("recv", 1, micro.back(), 1);
  const std::string rest = allreduce(1);
  EXPECT_EQ(ops_text(run_rank("pp", spec, plan, 0, 1).updates[0].pg), stage0 + rest);
  EXPECT_EQ(ops_text(run_rank("pp", spec, plan, 1, 1).updates[0].pg), stage1 + rest);
}

// 1F1B at PP = 4 (and PP = 2 x DP = 2), every update: every send has the matching receive
// on its peer (same tag and size, in order), and stage s holds at most PP - s microbatches
// in flight (activations sent whose gradient has not come back), reaching min(PP - s, M);
// GPipe would hold all M.
TEST_F(Collectives, PpOneFOneBPairsEverySendAndBoundsInFlight) {
  struct Case {
    int dp, pp;
  };
  for (const Case c : {Case{1, 4}, Case{2, 2}}) {
    Spec spec = spec_for(c.dp, 1, c.pp);
    spec.model.layers = 4;
    spec.batch.accum = 6;
    const Plan plan = make_plan(spec);
    const int W = static_cast<int>(plan.windows.size());
    std::vector<RankRun> runs;
    for (int r = 0; r < plan.world(); ++r) runs.push_back(run_rank("pp", spec, plan, r, W));
    for (int u = 0; u < W; ++u) {
      SCOPED_TRACE("DP " + str(c.dp) + " PP " + str(c.pp) + " update " + str(u));
      std::vector<std::vector<RecordedOp>> pg;
      for (const auto& run : runs) pg.push_back(run.updates[u].pg);
      EXPECT_EQ(unpaired_p2p(pg), "");
      for (int r = 0; r < plan.world(); ++r) {
        const Coords me = coords_of(plan, r);
        if (me.pp == plan.pp - 1) continue;
        int M = 0;
        for (int a = 0; a < plan.accum; ++a) M += !plan.windows[u].slots[me.dp][a].ids.empty();
        int in_flight = 0, peak = 0, sends = 0;
        for (const auto& o : pg[r]) {
          if (o.op == "send" && o.peer == global_rank_of(plan, {me.dp, 0, me.pp + 1})) ++in_flight, ++sends;
          if (o.op == "recv" && o.peer == global_rank_of(plan, {me.dp, 0, me.pp + 1})) --in_flight;
          peak = std::max(peak, in_flight);
        }
        EXPECT_EQ(sends, M) << "rank " << r;
        EXPECT_EQ(peak, std::min(plan.pp - me.pp, M)) << "rank " << r << "\n" << ops_text(pg[r]);
      }
    }
  }
}

// ---- tensor parallel ------------------------------------------------------------------------

// tp: per block and non-empty microbatch, two activation all-reduces forward (after each
// row-parallel linear) and two backward (before each column-parallel one), each of B x T x
// d_model, on tp_pg only. N, the loss and the gradient all-reduce (of the rank's local
// parameters) go to the DP group (none at D = 1); pg carries nothing: each rank writes its own
// slices as shard artifacts (NOTE [shard artifacts]).
TEST_F(Collectives, TpAllReducesActivationsOnTheTpGroup) {
  const ModelSpec m;
  const int64_t split = 3 * m.d_model * m.d_model + m.d_model * m.d_model + 2 * m.d_ff * m.d_model + m.d_ff;
  for (int D : {1, 2}) {
    const Spec spec = spec_for(D, 2, 1);
    const Plan plan = make_plan(spec);
    const int64_t P = param_count(spec), local = P - spec.model.layers * split / 2;
    const int W = static_cast<int>(plan.windows.size());
    for (int r = 0; r < plan.world(); ++r) {
      const auto run = run_rank("tp", spec, plan, r, W);
      for (int u : {0, W - 1}) {
        SCOPED_TRACE("D " + str(D) + " rank " + str(r) + " update " + str(u));
        std::string act;
        for (int a = 0; a < plan.accum; ++a) {
          const int64_t n = activation_numel(spec, plan, u, plan.dp_rank_of(r), a);
          for (int k = 0; n > 0 && k < 4 * spec.model.layers; ++k) act += allreduce(n);
        }
        const auto& log = run.updates[u];
        EXPECT_EQ(ops_text(log.tp), act);
        EXPECT_EQ(ops_text(log.pg), "");
        EXPECT_EQ(ops_text(log.dp), D == 1 ? "" : allreduce(2) + allreduce(2) + allreduce(local));
      }
    }
  }
}

// ---- every strategy -------------------------------------------------------------------------

// Every member of a group issues the same collectives in the same order with the same sizes
// (else a real run deadlocks or mixes up buffers), and p2p pairs up, on every rank of each
// topology and on every update, the final partial one (with empty microbatches) included.
TEST_F(Collectives, EveryGroupMemberIssuesTheSameCollectives) {
  struct Topo {
    std::string backend;
    int dp, tp, pp;
  };
  for (const Topo& t : {Topo{"ddp", 2, 1, 1}, Topo{"ddp", 3, 1, 1}, Topo{"zero1", 2, 1, 1}, Topo{"zero2", 3, 1, 1},
                        Topo{"zero3", 2, 1, 1}, Topo{"fsdp", 3, 1, 1}, Topo{"tp", 1, 2, 1}, Topo{"tp", 2, 2, 1},
                        Topo{"pp", 1, 1, 2}, Topo{"pp", 2, 1, 2}}) {
    const Spec spec = spec_for(t.dp, t.tp, t.pp);
    const Plan plan = make_plan(spec);
    const int W = static_cast<int>(plan.windows.size());
    ASSERT_TRUE(plan.windows.back().partial);
    std::vector<RankRun> runs;
    for (int r = 0; r < plan.world(); ++r) runs.push_back(run_rank(t.backend, spec, plan, r, W));
    for (int u = 0; u < W; ++u) {
      SCOPED_TRACE(t.backend + " D" + str(t.dp) + " TP" + str(t.tp) + " PP" + str(t.pp) + " update " + str(u));
      std::map<std::string, std::string> first_of_group;  // group -> its first member's collectives
      std::vector<std::vector<RecordedOp>> pg;
      for (int r = 0; r < plan.world(); ++r) {
        const Coords c = coords_of(plan, r);
        const auto& log = runs[r].updates[u];
        pg.push_back(log.pg);
        const std::vector<std::pair<std::string, const std::vector<RecordedOp>*>> groups = {
            {"pg", &log.pg},
            {"dp/" + str(c.tp) + "/" + str(c.pp), &log.dp},
            {"tp/" + str(c.dp) + "/" + str(c.pp), &log.tp}};
        for (const auto& [key, ops] : groups) {
          const auto [it, first] = first_of_group.emplace(key, collectives_text(*ops));
          if (!first) EXPECT_EQ(collectives_text(*ops), it->second) << "rank " << r << " group " << key;
        }
        EXPECT_TRUE(std::isfinite(log.out.loss)) << "rank " << r;
      }
      EXPECT_EQ(unpaired_p2p(pg), "");
      // Not vacuous: rank 0 collects over some group (tp's pg carries nothing since its artifacts
      // are shards, NOTE [shard artifacts]; its activations go over tp_pg).
      const auto& log0 = runs[0].updates[u];
      EXPECT_NE(collectives_text(log0.pg) + collectives_text(log0.dp) + collectives_text(log0.tp), "");
    }
  }
}
