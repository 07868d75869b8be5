// The seeded synthetic dataset: a pure function of (spec, sample id).
#pragma once
#include <cstdint>
#include <vector>

#include "conformance/core/spec.hpp"

namespace gradcert {

/// Label value that does not count in the loss (prompt tokens, padding, last position).
constexpr int64_t kIgnoreIndex = -100;
/// Token id used for padding.
constexpr int64_t kPadToken = 0;

/// Which part of the length distribution an example was drawn from.
enum class LengthBucket { Short, Typical, Long };

/// One example: next-token prediction with the prompt masked out of the loss.
struct Sample {
  int64_t id = 0;
  LengthBucket bucket = LengthBucket::Typical;
  int prompt_len = 0;             ///< leading tokens whose successors are not targets
  std::vector<int64_t> tokens;    ///< input ids, no padding, all in [1, vocab)
  std::vector<int64_t> labels;    ///< labels[t] = tokens[t+1] or kIgnoreIndex
  int64_t valid_targets() const;  ///< labels != kIgnoreIndex
};

/// Example `id` of the spec's dataset (0 <= id < dataset.size). Deterministic: any rank
/// recomputes the same example.
Sample make_sample(const Spec& spec, int64_t id);

/// SplitMix64: the project's one source of pseudo-randomness for data and plans.
uint64_t mix64(uint64_t x);
/// A uniform double in [0, 1) from a key.
double unit_from(uint64_t key);

}  // namespace gradcert
