// zero2: ZeRO stage 2: + gradients reduce-scattered: each rank receives (and keeps) only its shard of
// the averaged gradient; the full local gradients are freed after the reduce-scatter.
#include "backends/zero.hpp"

namespace gradcert {

std::unique_ptr<Backend> make_zero2_backend() { return std::make_unique<ZeroBackend>(2); }

}  // namespace gradcert
