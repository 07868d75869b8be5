// The collectives the built-in strategies call, on whichever device their tensors live (NOTE
// [collectives on a device]), and the process groups they run on.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <string>

#include "backends/runtime/strategy.hpp"

namespace gradcert {

/// The process group a built-in run uses (NOTE [collectives on a device]): "nccl" when the
/// ranks run on CUDA with a GPU each (world <= gpus) and this torch has NCCL; "gloo" otherwise
/// (the CPU, or ranks sharing a GPU, which NCCL refuses).
std::string process_group_kind(bool cuda, int world, int gpus);

/// SUM all-reduce of `t` in place.
void all_reduce_sum(c10d::Backend& g, torch::Tensor& t);
/// Every rank's `in` (same length) concatenated into `out` in rank order.
void all_gather_into(c10d::Backend& g, torch::Tensor& out, const torch::Tensor& in);
/// `out` := this rank's slice of the SUM of every rank's `in` (len(in) = len(out) x size).
void reduce_scatter_into(c10d::Backend& g, torch::Tensor& out, const torch::Tensor& in);
/// Point to point (pipeline stages); the send is waited for by the caller.
c10::intrusive_ptr<c10d::Work> send_to(c10d::Backend& g, const torch::Tensor& t, int peer, int tag);
torch::Tensor recv_from(c10d::Backend& g, torch::Tensor into, int peer, int tag);

}  // namespace gradcert
