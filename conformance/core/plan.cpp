#include "conformance/core/plan.hpp"

#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "conformance/core/dataset.hpp"

namespace gradcert {

int data_parallel_degree(int world, int tp, int pp) {
  if (tp < 1) throw SpecError("topology.tp", "must be >= 1");
  if (pp < 1) throw SpecError("topology.pp", "must be >= 1");
  if (world < 1 || world % (tp * pp) != 0)
    throw SpecError("topology",
                    "world " + std::to_string(world) + " is not a multiple of TP x PP = " + std::to_string(tp * pp));
  return world / (tp * pp);
}

int64_t update_batch_size(int micro, int accum, int dp) { return static_cast<int64_t>(micro) * accum * dp; }

namespace {

std::vector<int64_t> epoch_order(const Spec& spec, int epoch) {
  std::vector<int64_t> order(spec.dataset.size);
  std::iota(order.begin(), order.end(), 0);
  if (!spec.dataset.shuffle) return order;
  const uint64_t key = mix64(spec.seed ^ 0x5EEDULL) + static_cast<uint64_t>(epoch) * 0x100000001B3ULL;
  for (int64_t i = static_cast<int64_t>(order.size()) - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(mix64(key + static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace

Plan make_plan(const Spec& spec) {
  validate_spec(spec);
  Plan p;
  p.dp = spec.topology.dp;
  p.tp = spec.topology.tp;
  p.pp = spec.topology.pp;
  p.micro = spec.batch.micro;
  p.accum = spec.batch.accum;
  p.update_batch = update_batch_size(p.micro, p.accum, p.dp);
  const int64_t size = spec.dataset.size;
  p.windows_per_epoch = static_cast<int>((size + p.update_batch - 1) / p.update_batch);

  std::vector<Sample> samples;
  samples.reserve(size);
  for (int64_t id = 0; id < size; ++id) samples.push_back(make_sample(spec, id));

  std::vector<int64_t> order;
  const int updates = spec.updates > 0 ? spec.updates : p.windows_per_epoch;
  for (int u = 0; u < updates; ++u) {
    Window w;
    w.update = u;
    w.epoch = u / p.windows_per_epoch;
    w.index_in_epoch = u % p.windows_per_epoch;
    if (w.index_in_epoch == 0) order = epoch_order(spec, w.epoch);
    const int64_t begin = w.index_in_epoch * p.update_batch;
    const int64_t end = std::min<int64_t>(begin + p.update_batch, size);
    w.ids.assign(order.begin() + begin, order.begin() + end);
    w.partial = end - begin < p.update_batch;
    // Microstep-major: microstep a takes the next D x B_micro examples, rank r the r-th
    // B_micro of them; in a partial window the trailing slots run dry (possibly whole ranks).
    w.slots.assign(p.dp, std::vector<Microbatch>(p.accum));
    for (size_t k = 0; k < w.ids.size(); ++k) {
      const int a = static_cast<int>(k / (static_cast<size_t>(p.dp) * p.micro));
      const int r = static_cast<int>((k / p.micro) % p.dp);
      const Sample& s = samples[w.ids[k]];
      Microbatch& mb = w.slots[r][a];
      mb.ids.push_back(s.id);
      mb.input_tokens += static_cast<int64_t>(s.tokens.size());
      mb.valid_targets += s.valid_targets();
      w.valid_targets += s.valid_targets();
    }
    p.windows.push_back(std::move(w));
  }
  return p;
}

Spec second_leg_spec(const Spec& spec) {
  if (spec.resume.at == 0 || (!spec.resume.world && !spec.resume.micro && !spec.resume.accum)) return spec;
  Spec s = spec;
  const int tp = spec.topology.tp, pp = spec.topology.pp;
  const int world = spec.resume.world ? spec.resume.world : spec.topology.world();
  const int64_t B = update_batch_size(spec.batch.micro, spec.batch.accum, spec.topology.dp);
  if (world % (tp * pp) != 0)
    throw SpecError("resume.world",
                    std::to_string(world) + " is not a multiple of TP x PP = " + std::to_string(tp * pp));
  const int dp = world / (tp * pp);
  s.topology.dp = dp;
  const std::string keep = "B_update " + std::to_string(B) + " (" + std::to_string(spec.batch.micro) + " x " +
                           std::to_string(spec.batch.accum) + " x " + std::to_string(spec.topology.dp) + ")";
  if (spec.resume.micro || spec.resume.accum) {
    s.batch.micro = spec.resume.micro ? spec.resume.micro : spec.batch.micro;
    s.batch.accum = spec.resume.accum ? spec.resume.accum : static_cast<int>(B / (int64_t(s.batch.micro) * dp));
    if (update_batch_size(s.batch.micro, s.batch.accum, dp) != B)
      throw SpecError(spec.resume.micro ? "resume.micro" : "resume.accum",
                      std::to_string(s.batch.micro) + " x " + std::to_string(s.batch.accum) + " x " +
                          std::to_string(dp) + " does not keep the first leg's " + keep);
  } else if (B % (int64_t(spec.batch.micro) * dp) == 0) {
    s.batch.accum = static_cast<int>(B / (int64_t(spec.batch.micro) * dp));
  } else if (B % (int64_t(spec.batch.accum) * dp) == 0) {
    s.batch.micro = static_cast<int>(B / (int64_t(spec.batch.accum) * dp));
  } else {
    throw SpecError("resume.world", "D = " + std::to_string(dp) + " cannot keep the first leg's " + keep +
                                        " with its micro batch or its accumulation steps: give resume.micro and "
                                        "resume.accum");
  }
  validate_spec(s);
  return s;
}

Plan resumed_plan(const Spec& spec, const Plan& first, const Plan& q) {
  Plan p = first;
  if (spec.resume.at == 0 || (q.dp == p.dp && q.micro == p.micro && q.accum == p.accum)) return p;
  for (size_t u = static_cast<size_t>(spec.resume.at); u < p.windows.size(); ++u) {
    if (q.windows.at(u).ids != p.windows[u].ids)  // the same B_update and order: never
      throw SpecError("resume.world", "the second leg's window " + std::to_string(u) + " holds other examples");
    p.windows[u] = q.windows[u];
  }
  return p;
}

std::string plan_to_text(const Plan& p) {
  std::ostringstream o;
  o << "# plan: D=" << p.dp << " TP=" << p.tp << " PP=" << p.pp << " B_micro=" << p.micro << " A=" << p.accum
    << " B_update=" << p.update_batch << " (" << p.micro << "x" << p.accum << "x" << p.dp << "), windows per epoch "
    << p.windows_per_epoch << "\n";
  for (const auto& w : p.windows) {
    o << "update " << w.update << "  epoch " << w.epoch << "  examples " << w.ids.size() << "/" << p.update_batch
      << (w.partial ? " (partial)" : "") << "  N=" << w.valid_targets << "\n";
    for (int r = 0; r < p.dp; ++r)
      for (int a = 0; a < p.accum; ++a) {
        const auto& mb = w.slots[r][a];
        o << "  rank " << r << " micro " << a << "  ids [";
        for (size_t i = 0; i < mb.ids.size(); ++i) o << (i ? " " : "") << mb.ids[i];
        o << "]  tokens " << mb.input_tokens << "  targets " << mb.valid_targets
          << (mb.ids.empty() ? "  (empty: still joins every collective)" : "") << "\n";
      }
  }
  return o.str();
}

std::string plan_to_json(const Plan& p, const Spec& spec) {
  using nlohmann::json;
  json windows = json::array();
  for (const auto& w : p.windows) {
    json ranks = json::array();
    for (int r = 0; r < p.dp; ++r) {
      json micro = json::array();
      for (int a = 0; a < p.accum; ++a)
        micro.push_back({{"ids", w.slots[r][a].ids},
                         {"input_tokens", w.slots[r][a].input_tokens},
                         {"valid_targets", w.slots[r][a].valid_targets}});
      ranks.push_back(micro);
    }
    windows.push_back({{"update", w.update},
                       {"epoch", w.epoch},
                       {"partial", w.partial},
                       {"ids", w.ids},
                       {"valid_targets", w.valid_targets},
                       {"slots", ranks}});
  }
  json j = {{"schema", "gradcert.plan/1"},
            {"spec", json::parse(spec_to_json(spec))},
            {"topology", {{"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}}},
            {"update_batch", p.update_batch},
            {"windows_per_epoch", p.windows_per_epoch},
            {"windows", windows}};
  return j.dump(1);
}

}  // namespace gradcert
