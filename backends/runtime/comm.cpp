#include "backends/runtime/comm.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace gradcert {

// NOTE [collectives on a device] Built-in ranks on `--device cuda` (NOTE [compute device]) keep
// model, data and optimizer state on their GPU, cuda:<rank mod GPUs>. With a GPU per rank they
// talk NCCL (c10d ProcessGroupNCCL). Where ranks share a GPU, NCCL refuses (one communicator
// rank per device), so they talk Gloo, and Gloo reaches CUDA tensors only for some collectives
// (none of send / recv / reduce-scatter): every collective here stages a tensor through host
// memory when the group is Gloo and the tensor is on a GPU, and onto the GPU when the group is
// NCCL and the tensor is a host scalar (the loss and N sums). On the CPU nothing is staged: the
// same calls as before, the same figures. The staging is the copies a Gloo-on-CUDA run pays; the
// report names the group (harness), so a step time is read with it.
std::string process_group_kind(bool cuda, int world, int gpus) {
#ifdef USE_C10D_NCCL
  if (cuda && gpus > 0 && world <= gpus) return "nccl";
#else
  (void)cuda, (void)world, (void)gpus;
#endif
  return "gloo";
}

namespace {

bool is_nccl(c10d::Backend& g) { return g.getBackendName() == "nccl"; }

// The tensor the group can take: `t` itself, or a staged copy (see the note).
torch::Tensor staged(c10d::Backend& g, const torch::Tensor& t) {
  if (is_nccl(g)) return t.is_cuda() ? t.contiguous() : t.to(compute_device()).contiguous();
  return t.is_cuda() ? t.cpu().contiguous() : t.contiguous();
}

void copy_back(torch::Tensor& into, const torch::Tensor& staged_copy) {
  if (!staged_copy.is_same(into)) into.copy_(staged_copy);
}

c10::intrusive_ptr<c10d::Backend> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             double timeout_s) {
  auto opts =
      c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

c10::intrusive_ptr<c10d::Backend> group(const std::string& kind, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                        int size, double timeout_s) {
#ifdef USE_C10D_NCCL
  if (kind == "nccl") {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  }
#endif
  (void)kind;
  return gloo_group(store, rank, size, timeout_s);
}

}  // namespace

void all_reduce_sum(c10d::Backend& g, torch::Tensor& t) {
  std::vector<at::Tensor> v{staged(g, t)};
  g.allreduce(v, c10d::AllreduceOptions{})->wait();
  copy_back(t, v[0]);
}

void all_gather_into(c10d::Backend& g, torch::Tensor& out, const torch::Tensor& in) {
  auto o = staged(g, out);
  auto i = staged(g, in);
  g._allgather_base(o, i)->wait();
  copy_back(out, o);
}

void reduce_scatter_into(c10d::Backend& g, torch::Tensor& out, const torch::Tensor& in) {
  auto o = staged(g, out);
  auto i = staged(g, in);
  g._reduce_scatter_base(o, i)->wait();
  copy_back(out, o);
}

c10::intrusive_ptr<c10d::Work> send_to(c10d::Backend& g, const torch::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{staged(g, t)};  // the work holds the staged copy until it is waited for
  return g.send(v, peer, tag);
}

torch::Tensor recv_from(c10d::Backend& g, torch::Tensor into, int peer, int tag) {
  std::vector<at::Tensor> v{staged(g, into)};
  g.recv(v, peer, tag)->wait();
  copy_back(into, v[0]);
  return into;
}

void make_process_groups(RankContext& ctx, const c10::intrusive_ptr<c10d::Store>& store) {
  const Plan& p = *ctx.plan;
  const double t = ctx.spec->timeout.collective_s;
  const std::string kind = ctx.process_group;
  ctx.pg = group(kind, store, ctx.rank, ctx.world, t);
  const Coords me = coords_of(p, ctx.rank);
  if (p.dp > 1 && p.dp < ctx.world) {
    const std::string prefix = "dp/" + std::to_string(me.tp) + "/" + std::to_string(me.pp);
    ctx.dp_pg = group(kind, c10::make_intrusive<c10d::PrefixStore>(prefix, store), me.dp, p.dp, t);
  }
  if (p.tp > 1) {
    const std::string prefix = "tp/" + std::to_string(me.dp) + "/" + std::to_string(me.pp);
    ctx.tp_pg = group(kind, c10::make_intrusive<c10d::PrefixStore>(prefix, store), me.tp, p.tp, t);
  }
}

}  // namespace gradcert
