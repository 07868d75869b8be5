// train.finite: a non-finite loss, loss sum, gradient or parameter (NOTE [non-finite values]).
#include "conformance/checks/checks.hpp"

#include "conformance/core/format.hpp"

#include <cmath>

namespace gradcert {

namespace {

// "[1, 3]": the row-major index `flat` of a tensor of `shape`, per dimension.
std::string element_at(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> at(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t n = std::max<int64_t>(shape[d], 1);
    at[d] = flat % n;
    flat /= n;
  }
  std::string out = "[";
  for (size_t d = 0; d < at.size(); ++d) out += (d ? ", " : "") + std::to_string(at[d]);
  return out + "]";
}

struct Found {
  int64_t count = 0;
  std::string first;  // where the first non-finite value of the run is, update order
  int first_update = -1;
};

void note(Found& f, int update, const std::string& what) {
  ++f.count;
  if (f.first.empty()) f.first = what, f.first_update = update;
}

// The first non-finite element of each tensor in `tensors` (counted whole), named `kind`.
void scan(Found& f, int u, const TensorMap& tensors, const char* kind) {
  for (const auto& [name, t] : tensors) {
    const TensorValues v = t.read();
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i])) bad += 1, first = first < 0 ? static_cast<int64_t>(i) : first;
    if (bad == 0) continue;
    note(f, u,
         "update " + std::to_string(u) + ": the " + kind + " of " + name + " is " + figure_text(v[first]) + " at " +
             element_at(first, t.shape) + " (" + std::to_string(bad) + " of " + std::to_string(v.size()) +
             " elements)");
    f.count += bad - 1;
  }
}

bool non_finite_figure(const std::vector<CheckResult>& judged) {
  for (const auto& c : judged)
    if (!std::isfinite(c.figure)) return true;
  return false;
}

}  // namespace

std::optional<CheckResult> check_finite(const CheckInput& in, const std::vector<CheckResult>& judged) {
  Found f;
  const bool tensors = non_finite_figure(judged);  // a non-finite tensor makes its parity figure so
  for (const auto& bu : *in.run) {
    const int u = bu.update;
    if (bu.has_loss && !std::isfinite(bu.loss))
      note(f, u, "update " + std::to_string(u) + ": the stack's loss is " + figure_text(bu.loss));
    for (const auto& r : bu.ranks)
      if (r.has_loss_sum && !std::isfinite(r.loss_sum))
        note(f, u,
             "update " + std::to_string(u) + ", rank " + std::to_string(r.rank) + ": loss_sum " +
                 figure_text(r.loss_sum));
    if (tensors) scan(f, u, bu.grads, "gradient"), scan(f, u, bu.params_after, "parameters after the step");
  }
  if (f.count == 0) return std::nullopt;
  CheckResult c;
  c.id = "train.finite";
  c.verdict = Verdict::Fail;
  c.figure = static_cast<double>(f.count);
  c.detail = "first non-finite value: " + f.first + "; " + std::to_string(f.count) + " in all";
  const auto& ref = *in.reference;
  if (f.first_update >= 0 && static_cast<size_t>(f.first_update) < ref.size() &&
      !std::isfinite(ref[f.first_update].loss))
    c.detail += "; the reference's loss there is " + figure_text(ref[f.first_update].loss) +
                " too: the spec's own training diverges (a learning rate too large?)";
  else
    c.detail += "; the reference's is finite there: the stack computed it";
  return c;
}

}  // namespace gradcert
