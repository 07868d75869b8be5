// batch.sample_ledger: each example exactly once per epoch, TP / PP peers of a replica on the same
// examples; a repeat names every (rank, update, microstep) that consumed it, and the known cause
// where the pattern shows one.
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "conformance/checks/checks.hpp"

namespace gradcert {

namespace {

std::string ids_text(const std::vector<int64_t>& ids, size_t limit = 8) {
  std::ostringstream o;
  for (size_t i = 0; i < ids.size() && i < limit; ++i) o << (i ? "," : "") << ids[i];
  if (ids.size() > limit) o << ",... (" << ids.size() << ")";
  return o.str();
}

struct Use {
  int rank = 0, update = 0, microstep = 0;
};

std::string uses_text(const std::vector<Use>& uses) {
  std::string out;
  for (size_t i = 0; i < uses.size() && i < 4; ++i)
    out += std::string(i ? ", " : "") + "rank " + std::to_string(uses[i].rank) + " update " +
           std::to_string(uses[i].update) + " microstep " + std::to_string(uses[i].microstep);
  return out + (uses.size() > 4 ? " and " + std::to_string(uses.size() - 4) + " more" : "");
}

// Whether window u is the last its epoch has in the plan (where an epoch-padding sampler repeats).
bool last_of_epoch(const Plan& plan, size_t u) {
  return u + 1 >= plan.windows.size() || plan.windows[u + 1].epoch != plan.windows[u].epoch;
}

}  // namespace

CheckResult check_sample_ledger(const Plan& plan, int64_t dataset_size, const std::vector<BackendUpdate>& run) {
  const std::string id = "batch.sample_ledger";
  std::map<int, std::map<int64_t, std::vector<Use>>> seen;  // epoch -> id -> who consumed it
  std::vector<std::string> problems;
  int64_t wrong = 0;
  for (size_t u = 0; u < run.size() && u < plan.windows.size(); ++u) {
    const int epoch = plan.windows[u].epoch;
    std::map<int, std::vector<int64_t>> by_replica;
    std::map<int, const RankRecord*> first_of_replica;
    for (const auto& r : run[u].ranks) {
      std::vector<int64_t> flat;
      for (const auto& mb : r.consumed) flat.insert(flat.end(), mb.begin(), mb.end());
      auto [it, fresh] = by_replica.emplace(r.dp_rank, flat);
      if (fresh) first_of_replica[r.dp_rank] = &r;
      if (!fresh && it->second != flat) {
        ++wrong;
        problems.push_back("update " + std::to_string(u) + ": rank " + std::to_string(r.rank) +
                           " saw other examples than its replica peers");
      }
    }
    for (const auto& [dp, rec] : first_of_replica)
      for (size_t a = 0; a < rec->consumed.size(); ++a)
        for (auto sid : rec->consumed[a]) {
          if (sid < 0 || sid >= dataset_size) {
            ++wrong;
            problems.push_back("update " + std::to_string(u) + ": id " + std::to_string(sid) + " outside the dataset");
            continue;
          }
          seen[epoch][sid].push_back({rec->rank, static_cast<int>(u), static_cast<int>(a)});
        }
  }
  const int complete_epochs = static_cast<int>(run.size()) / std::max(1, plan.windows_per_epoch);
  for (const auto& [epoch, uses] : seen) {
    std::vector<int64_t> dup, missing;
    std::string where;
    bool repeats_at_epoch_end = true;
    for (const auto& [sid, who] : uses) {
      if (who.size() < 2) continue;
      dup.push_back(sid), wrong += static_cast<int64_t>(who.size()) - 1;
      if (dup.size() <= 3)
        where += std::string(dup.size() > 1 ? "; " : "") + "id " + std::to_string(sid) + " by " + uses_text(who);
      for (size_t i = 1; i < who.size(); ++i)
        repeats_at_epoch_end &= last_of_epoch(plan, static_cast<size_t>(who[i].update));
    }
    if (epoch < complete_epochs)
      for (int64_t sid = 0; sid < dataset_size; ++sid)
        if (!uses.count(sid)) missing.push_back(sid), ++wrong;
    if (!dup.empty())
      problems.push_back("epoch " + std::to_string(epoch) + ": ids " + ids_text(dup) + " consumed more than once (" +
                         where + (dup.size() > 3 ? "; ..." : "") + ")" +
                         (repeats_at_epoch_end
                              ? ": every repeat falls in the epoch's last window, as a sampler that pads "
                                "the epoch to a multiple of the world by repeating examples does "
                                "(DistributedSampler(drop_last=False); drop_last=True drops them instead)"
                              : ""));
    if (!missing.empty())
      problems.push_back("epoch " + std::to_string(epoch) + ": ids " + ids_text(missing) + " never consumed");
  }
  std::string detail;
  for (size_t i = 0; i < problems.size(); ++i) detail += (i ? "; " : "") + problems[i];
  if (detail.empty())
    detail = "each of " + std::to_string(dataset_size) + " examples once per epoch (" +
             std::to_string(complete_epochs) + " complete)";
  return {id, wrong == 0 ? Verdict::Pass : Verdict::Fail, static_cast<double>(wrong), 0, detail};
}

}  // namespace gradcert
