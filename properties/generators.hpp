// Rapidcheck generators for gradcert's domain types, in one place. Torch-free.
#pragma once
#include <rapidcheck.h>

#include <cstdint>
#include <ostream>
#include <vector>

#include "conformance/core/spec.hpp"

namespace gradcert::props {

/// The longest example a generated spec holds (keeps the model tiny and cases fast).
constexpr int kTinyMaxLen = 12;

/// The tiny model every generated gradient spec uses: vocab 16, d_model 8, 2 heads.
inline ModelSpec tiny_model(int layers) {
  ModelSpec m;
  m.vocab = 16;
  m.d_model = 8;
  m.heads = 2;
  m.layers = layers;
  m.d_ff = 16;
  m.max_len = kTinyMaxLen;
  return m;
}

/// Per-(DP rank, microstep) loss sums S and valid-target counts n of one window.
/// S[r][a] is 0 whenever n[r][a] is 0 (a microbatch without targets has no loss).
struct LossGrid {
  std::vector<std::vector<double>> S;
  std::vector<std::vector<int64_t>> n;
  int ranks() const { return static_cast<int>(S.size()); }
  int micro() const { return S.empty() ? 0 : static_cast<int>(S[0].size()); }
};

/// Batch shape plus the dataset size of one epoch, relative to B_update so that partial
/// final windows and ranks without examples come up often.
struct EpochShape {
  BatchSpec batch;
  int full_windows = 0;  ///< complete windows in the epoch
  int remainder = 0;     ///< examples in the partial final window (0: none)
};

}  // namespace gradcert::props

namespace rc {

/// D in [1, 8], TP in {1, 2, 4}, PP in {1, 2, 3}; world = D x TP x PP.
template <>
struct Arbitrary<gradcert::TopologySpec> {
  static Gen<gradcert::TopologySpec> arbitrary() {
    using T = gradcert::TopologySpec;
    return gen::build<T>(gen::set(&T::dp, gen::inRange(1, 9).as("D")), gen::set(&T::tp, gen::element(1, 2, 4).as("TP")),
                         gen::set(&T::pp, gen::element(1, 2, 3).as("PP")));
  }
};

/// B_micro in [1, 4], A in [1, 4].
template <>
struct Arbitrary<gradcert::BatchSpec> {
  static Gen<gradcert::BatchSpec> arbitrary() {
    using B = gradcert::BatchSpec;
    return gen::build<B>(gen::set(&B::micro, gen::inRange(1, 5).as("B_micro")),
                         gen::set(&B::accum, gen::inRange(1, 5).as("A")));
  }
};

/// The length distribution (three buckets within kTinyMaxLen) and the label masks
/// (prompt share, all-prompt share) of a dataset; size and shuffle are left at defaults.
template <>
struct Arbitrary<gradcert::DatasetSpec> {
  static Gen<gradcert::DatasetSpec> arbitrary() {
    using gradcert::DatasetSpec;
    const auto lengths = gen::mapcat(
        gen::tuple(gen::inRange(2, 4), gen::inRange(4, 7), gen::inRange(7, 10)), [](std::tuple<int, int, int> lo) {
          return gen::tuple(gen::just(lo), gen::inRange(std::get<0>(lo), 4), gen::inRange(std::get<1>(lo), 8),
                            gen::inRange(std::get<2>(lo), gradcert::props::kTinyMaxLen + 1));
        });
    return gen::map(
        gen::tuple(lengths.as("length mins / maxes"), gen::element(0.0, 0.2, 0.5).as("short_share"),
                   gen::element(0.0, 0.15, 0.4).as("long_share"), gen::element(0.0, 0.3, 0.6, 0.9).as("prompt_share"),
                   gen::element(0.0, 0.1, 0.5, 1.0).as("all_prompt_share"), gen::arbitrary<bool>().as("shuffle")),
        [](const auto& t) {
          DatasetSpec d;
          const auto& [lo, smax, tmax, lmax] = std::get<0>(t);
          std::tie(d.short_min, d.typical_min, d.long_min) = lo;
          d.short_max = smax;
          d.typical_max = tmax;
          d.long_max = lmax;
          d.short_share = std::get<1>(t);
          d.long_share = std::get<2>(t);
          d.prompt_share = std::get<3>(t);
          d.all_prompt_share = std::get<4>(t);
          d.shuffle = std::get<5>(t);
          return d;
        });
  }
};

/// A batch shape and an epoch of 0-3 full windows plus a remainder (at least one example).
template <>
struct Arbitrary<gradcert::props::EpochShape> {
  static Gen<gradcert::props::EpochShape> arbitrary() {
    return gen::mapcat(gen::arbitrary<gradcert::BatchSpec>(), [](gradcert::BatchSpec b) {
      return gen::map(gen::tuple(gen::inRange(0, 4).as("full windows"), gen::inRange(0, 64).as("remainder seed")),
                      [b](std::tuple<int, int> t) {
                        gradcert::props::EpochShape e;
                        e.batch = b;
                        e.full_windows = std::get<0>(t);
                        e.remainder = std::get<1>(t);  // reduced modulo B_update by the user
                        return e;
                      });
    });
  }
};

/// D in [1, 8] ranks x A in [1, 4] microsteps; n in [0, 5] (zeros allowed), S a loss sum
/// of n tokens with per-token loss in [0.1, 5] (S = 0 when n = 0).
template <>
struct Arbitrary<gradcert::props::LossGrid> {
  static Gen<gradcert::props::LossGrid> arbitrary() {
    const auto cell = gen::mapcat(gen::inRange<int64_t>(0, 6).as("n"), [](int64_t n) {
      return gen::map(gen::inRange(1, 51),
                      [n](int tenths) { return std::pair<double, int64_t>(n == 0 ? 0.0 : n * tenths / 10.0, n); });
    });
    return gen::mapcat(gen::tuple(gen::inRange(1, 9).as("ranks"), gen::inRange(1, 5).as("microsteps")),
                       [cell](std::tuple<int, int> shape) {
                         const auto [D, A] = shape;
                         return gen::map(gen::container<std::vector<std::pair<double, int64_t>>>(
                                             static_cast<std::size_t>(D * A), cell),
                                         [D = D, A = A](const std::vector<std::pair<double, int64_t>>& cells) {
                                           gradcert::props::LossGrid g;
                                           g.S.assign(D, std::vector<double>(A));
                                           g.n.assign(D, std::vector<int64_t>(A));
                                           for (int r = 0; r < D; ++r)
                                             for (int a = 0; a < A; ++a)
                                               std::tie(g.S[r][a], g.n[r][a]) = cells[r * A + a];
                                           return g;
                                         });
                       });
  }
};

}  // namespace rc

namespace gradcert::props {

/// A small spec for gradient properties: D in [1, max_dp], the tiny model (1-2 layers),
/// float64, SGD, one epoch of `EpochShape` (partial final windows common), seeded data.
rc::Gen<Spec> tiny_spec(int max_dp);
}  // namespace gradcert::props

// rapidcheck's show for the domain types, so counterexamples read as specs.
namespace gradcert {
void showValue(const TopologySpec& t, std::ostream& os);
void showValue(const BatchSpec& b, std::ostream& os);
void showValue(const DatasetSpec& d, std::ostream& os);
void showValue(const Spec& s, std::ostream& os);
namespace props {
void showValue(const LossGrid& g, std::ostream& os);
void showValue(const EpochShape& e, std::ostream& os);
}  // namespace props
}  // namespace gradcert
