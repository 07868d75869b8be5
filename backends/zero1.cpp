// zero1: ZeRO stage 1: optimizer state (and master weights) sharded over the D ranks: gradients are
// all-reduced in full, each rank steps only its shard, and the updated shards are all-gathered.
#include "backends/zero.hpp"

namespace gradcert {

std::unique_ptr<Backend> make_zero1_backend() { return std::make_unique<ZeroBackend>(1); }

}  // namespace gradcert
