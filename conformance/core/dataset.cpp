#include "conformance/core/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace gradcert {

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

double unit_from(uint64_t key) { return static_cast<double>(mix64(key) >> 11) * 0x1.0p-53; }

int64_t Sample::valid_targets() const {
  return std::count_if(labels.begin(), labels.end(), [](int64_t l) { return l != kIgnoreIndex; });
}

Sample make_sample(const Spec& spec, int64_t id) {
  const auto& d = spec.dataset;
  if (id < 0 || id >= d.size)
    throw std::out_of_range("sample id " + std::to_string(id) + " outside the dataset [0, " + std::to_string(d.size) +
                            ")");
  const uint64_t base = mix64(spec.seed ^ mix64(0xD5A7ULL + static_cast<uint64_t>(id)));
  auto draw = [&](uint64_t k) { return unit_from(base + k); };
  auto between = [&](uint64_t k, int lo, int hi) { return lo + static_cast<int>(std::floor(draw(k) * (hi - lo + 1))); };

  Sample s;
  s.id = id;
  const double b = draw(1);
  int len;
  if (b < d.short_share) {
    s.bucket = LengthBucket::Short;
    len = between(2, d.short_min, d.short_max);
  } else if (b < d.short_share + d.long_share) {
    s.bucket = LengthBucket::Long;
    len = between(2, d.long_min, d.long_max);
  } else {
    s.bucket = LengthBucket::Typical;
    len = between(2, d.typical_min, d.typical_max);
  }
  if (draw(3) < d.all_prompt_share) {
    s.prompt_len = len;
  } else {
    // Prompt share uniform in [0, 2 * prompt_share], capped so at least one target remains.
    const double share = std::min(1.0, 2.0 * d.prompt_share * draw(4));
    s.prompt_len = std::min(len - 1, static_cast<int>(std::floor(share * len)));
  }
  s.tokens.resize(len);
  for (int t = 0; t < len; ++t)
    s.tokens[t] = 1 + static_cast<int64_t>(mix64(base + 100 + t) % static_cast<uint64_t>(spec.model.vocab - 1));
  s.labels.assign(len, kIgnoreIndex);
  for (int t = 0; t + 1 < len; ++t)
    if (t + 1 >= s.prompt_len) s.labels[t] = s.tokens[t + 1];
  return s;
}

}  // namespace gradcert
