// Properties 1-2: the update batch and the per-window valid-target counts of the plan.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <numeric>

#include "conformance/core/dataset.hpp"
#include "conformance/core/plan.hpp"
#include "properties/support.hpp"

using namespace gradcert;
using namespace gradcert::props;

namespace {

Spec batching_spec(const TopologySpec& topo, const BatchSpec& batch, int dataset_size, int updates, uint64_t seed) {
  Spec s;
  s.seed = seed;
  s.model = tiny_model(1);
  s.dataset.short_min = 2, s.dataset.short_max = 3;
  s.dataset.typical_min = 4, s.dataset.typical_max = 8;
  s.dataset.long_min = 9, s.dataset.long_max = kTinyMaxLen;
  s.dataset.size = dataset_size;
  s.batch = batch;
  s.topology = topo;
  s.updates = updates;
  return s;
}

}  // namespace

// 1. Every full window holds B_micro x A x D examples; TP and PP never multiply it; over an
// epoch every example is consumed exactly once, for any dataset size (gradcert keeps the
// partial final window: drop_last = false).
RC_GTEST_PROP(UpdateBatch, fullWindowsHoldMicroTimesAccumTimesDpAndEpochsConsumeEachExampleOnce,
              (const TopologySpec& topo, const BatchSpec& batch)) {
  const int64_t update_batch = static_cast<int64_t>(batch.micro) * batch.accum * topo.dp;
  const int size = *rc::gen::inRange(1, static_cast<int>(3 * update_batch + 2)).as("dataset size");
  const int epochs = *rc::gen::inRange(1, 4).as("epochs (the last may be unfinished)");
  const int windows_per_epoch = static_cast<int>((size + update_batch - 1) / update_batch);
  const int updates =
      *rc::gen::inRange((epochs - 1) * windows_per_epoch + 1, epochs * windows_per_epoch + 1).as("updates");
  const Spec spec = batching_spec(topo, batch, size, updates, *rc::gen::inRange<uint64_t>(0, 1000).as("seed"));
  const Plan plan = make_plan(spec);

  RC_ASSERT(data_parallel_degree(topo.world(), topo.tp, topo.pp) == topo.dp);
  RC_ASSERT(plan.update_batch == update_batch);
  RC_ASSERT(update_batch_size(batch.micro, batch.accum, topo.dp) == update_batch);
  // TP and PP peers share one replica's examples: tp x pp global ranks per DP rank.
  std::map<int, int> ranks_per_replica;
  for (int g = 0; g < plan.world(); ++g) ++ranks_per_replica[plan.dp_rank_of(g)];
  RC_ASSERT(static_cast<int>(ranks_per_replica.size()) == topo.dp);
  for (const auto& [dp_rank, n] : ranks_per_replica) RC_ASSERT(n == topo.tp * topo.pp);
  // The same batch without TP/PP gives the same windows: they never multiply it.
  TopologySpec flat = topo;
  flat.tp = flat.pp = 1;
  const Plan flat_plan = make_plan(batching_spec(flat, batch, size, updates, spec.seed));
  RC_ASSERT(flat_plan.windows.size() == plan.windows.size());

  std::map<int, std::map<int64_t, int>> seen;  // epoch -> id -> times
  bool any_partial = false, any_empty_rank = false;
  for (size_t u = 0; u < plan.windows.size(); ++u) {
    const Window& w = plan.windows[u];
    RC_ASSERT(w.ids == flat_plan.windows[u].ids);
    if (!w.partial) RC_ASSERT(static_cast<int64_t>(w.ids.size()) == update_batch);
    if (w.partial) RC_ASSERT(w.index_in_epoch == windows_per_epoch - 1);
    any_partial |= w.partial;
    // The slots are the window, microstep-major, each at most B_micro.
    std::vector<int64_t> from_slots;
    RC_ASSERT(static_cast<int>(w.slots.size()) == topo.dp);
    for (int a = 0; a < batch.accum; ++a)
      for (int r = 0; r < topo.dp; ++r) {
        const auto& ids = w.slots[r][a].ids;
        RC_ASSERT(static_cast<int>(ids.size()) <= batch.micro);
        from_slots.insert(from_slots.end(), ids.begin(), ids.end());
      }
    RC_ASSERT(from_slots == w.ids);
    for (int r = 0; r < topo.dp; ++r) {
      int64_t n = 0;
      for (const auto& mb : w.slots[r]) n += static_cast<int64_t>(mb.ids.size());
      any_empty_rank |= n == 0;
    }
    for (auto id : w.ids) ++seen[w.epoch][id];
  }
  for (const auto& [epoch, counts] : seen) {
    const bool finished = epoch < epochs - 1 || updates == epochs * windows_per_epoch;
    for (const auto& [id, times] : counts) RC_ASSERT(times == 1);
    if (finished) RC_ASSERT(static_cast<int>(counts.size()) == size);
  }
  RC_CLASSIFY(topo.tp * topo.pp > 1, "TP x PP > 1");
  RC_CLASSIFY(any_partial, "partial window");
  RC_CLASSIFY(any_empty_rank, "rank without examples");
  RC_CLASSIFY(updates < epochs * windows_per_epoch, "unfinished last epoch");
}

// 2. N of every window equals a recount of valid targets from the raw labels; a partial
// final window's N is its own recount, never the full window's.
RC_GTEST_PROP(WindowCount, everyWindowsNIsARecountOfItsOwnRawLabels, (const BatchSpec& batch)) {
  TopologySpec topo;
  topo.dp = *rc::gen::inRange(1, 5).as("D");
  const int64_t update_batch = static_cast<int64_t>(batch.micro) * batch.accum * topo.dp;
  Spec spec = batching_spec(topo, batch, *rc::gen::inRange(1, static_cast<int>(3 * update_batch + 2)).as("size"), 0,
                            *rc::gen::inRange<uint64_t>(0, 1000).as("seed"));
  const DatasetSpec lengths_and_masks = *rc::gen::arbitrary<DatasetSpec>();
  const int size = spec.dataset.size;
  spec.dataset = lengths_and_masks;
  spec.dataset.size = size;
  const Plan plan = make_plan(spec);

  auto raw_count = [&](int64_t id) {
    const Sample s = make_sample(spec, id);
    return static_cast<int64_t>(
        std::count_if(s.labels.begin(), s.labels.end(), [](int64_t l) { return l != kIgnoreIndex; }));
  };
  int64_t last_full_N = -1;
  bool partial_differs = false, all_prompt_micro = false;
  for (const Window& w : plan.windows) {
    int64_t recount = 0;
    for (auto id : w.ids) recount += raw_count(id);
    RC_ASSERT(w.valid_targets == recount);
    for (const auto& rank : w.slots)
      for (const auto& mb : rank) {
        int64_t n = 0;
        for (auto id : mb.ids) n += raw_count(id);
        RC_ASSERT(mb.valid_targets == n);
        all_prompt_micro |= !mb.ids.empty() && n == 0;
      }
    if (w.partial && last_full_N >= 0) partial_differs |= recount != last_full_N;
    if (!w.partial) last_full_N = w.valid_targets;
  }
  RC_CLASSIFY(partial_differs, "partial window N differs from the full window's");
  RC_CLASSIFY(all_prompt_micro, "all-prompt microbatch");
}
