// zero3: ZeRO stage 3: + parameters sharded: gathered for compute at the start of each update, freed
// after the step; only the shard persists.
#include "backends/zero.hpp"

namespace gradcert {

std::unique_ptr<Backend> make_zero3_backend() { return std::make_unique<ZeroBackend>(3); }

}  // namespace gradcert
