"""gradcert shim: PyTorch's own tensor parallelism (DTensor, `torch.distributed.tensor.parallel`)
under torchrun on Gloo (CPU), alone or composed with FSDP2 (`fully_shard`) on a 2-D mesh.

    torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
             --master_port=$GRADCERT_MASTER_PORT backends/python/stacks/torch_tp.py --config NAME

    gradcert run --backend external --world 2 --tp 2 ...           (default, token-global)
    gradcert run --backend external --world 4 --tp 2 ...           (fsdp2-tp: dp 2 x tp 2)

This is real PyTorch TP, not gradcert's own: `parallelize_module` with `ColwiseParallel` /
`RowwiseParallel` swaps the parameters of each block's attention and MLP for DTensors and
runs the sharded matmuls with DTensor's own collectives (all-reduce of the row-parallel
outputs forward, of the column-parallel inputs' gradients backward). PyTorch has no trainer:
the training loop is the user's own, a plain loop as PyTorch documents it (per window A
microsteps, forward, loss, backward; one `optimizer.step()`), fed the plan's ids of the DP
rank (`Run.consumed(dp_rank)`: the plan's slots, or under the sampler audit a
DistributedSampler's); the TP peers of a replica consume the same ids (global rank g has DP
rank g // tp, mesh ("dp", "tp") row-major).

The TP plan, per block (the tiny LM of gradcert/tiny_lm.py only; a factory model without
blocks.<i>.{qkv,proj,fc,fc_out} is refused):
  qkv     ColwiseParallel   (weight [3d, d] sharded on the output dim)
  proj    RowwiseParallel   (input Shard(-1), output all-reduced to Replicate; bias replicated)
  fc      ColwiseParallel
  fc_out  RowwiseParallel
  wte, wpe, ln1, ln2, ln_f, lm_head: not parallelized (plain replicated tensors in the 1-D
  case: every TP rank computes the same gradient and steps them alike).
NOTE [qkv split] q | k | v are chunks of qkv's last dim, so a plain ColwiseParallel of qkv
gives rank 0 the rows of q and half of k (tp 2): the local chunk(3) would mix q, k and v.
ColwiseParallel does what it says (an even split of the output dim); knowing where the
heads are is the user's job, as in PyTorch's TP tutorial, whose model has separate wq / wk /
wv. The shim keeps the one qkv Linear and permutes its rows once before parallelizing
(rank r's shard = [q heads of r | k heads of r | v heads of r], heads % tp == 0), and
gives each block the tutorial's "local number of heads" forward (heads // tp, the attention
output reshaped to the local width); the artifacts un-permute qkv.weight (grad and param),
so they carry the canonical layout. This is the shim's (the user's) code, not a finding.
`--qkv naive` skips the permutation (a plain ColwiseParallel of qkv, the user's mistake) as
a planted shim bug: gradcert fails it (the report says at what figure).

Configurations (--config):
  default       TP only (dp must be 1), 1-D mesh ("tp",): the loss of PyTorch's TP tutorial,
                F.cross_entropy (reduction "mean", ignore_index) per microbatch, divided by
                A for accumulation (the tutorial steps once per batch; /A is PyTorch's usual
                accumulation idiom). A per-microbatch mean: the diagnosis says micro-mean
                wherever microbatches hold different token counts.
  token-global  TP only (dp 1): the correct normalisation, loss = sum CE * D / N per
                microstep, N the window's valid targets all-reduced over the DP group (here
                D = 1: the local count).
  fsdp2-tp      FSDP2 x TP on a 2-D DeviceMesh ("dp", "tp") (world = dp x tp): TP as above on
                mesh["tp"], then fully_shard per block and on the root over mesh["dp"]
                (FSDP2 divides by D once, NOTE [FSDP2 gradient scaling] in torch_fsdp2.py),
                the token-global loss (D * S / N, N all-reduced over mesh["dp"]). FSDP2
                reduce-scatters every microstep (its default). A DP rank with an empty
                microstep still runs a forward/backward (FSDP2 all-gathers inside forward):
                a one-token batch without target, loss x 0.
  fsdp2-tp-default  the same 2-D stack with the default (tutorial) loss: mean CE / A.

What runs on CPU / Gloo (torch 2.13.0+cpu): all of it — init_device_mesh("cpu", ...),
parallelize_module with Colwise/Rowwise, DTensor all-reduce / all-gather on Gloo,
fully_shard over a 2-D mesh's "dp" dim, DTensor.full_tensor(): token-global (dp 1 x tp 2)
and fsdp2-tp (dp 2 x tp 2) certify exact in float64 (grad.parity ~2e-15, diagnosis
global-mean); default and fsdp2-tp-default are diagnosed micro-mean. Not parallelized:
wte / lm_head (no loss_parallel) and no SequenceParallel of the LayerNorms. Gradients and parameters for the artifacts: DTensor.full_tensor() (every rank
calls, outside the timed step), rank 0 writes. Clipping (optimizer.max_grad_norm > 0):
torch.nn.utils.clip_grad_norm_ is not given a mix of DTensors on different meshes and plain
tensors; the loop computes the global norm of the full gradients itself (full_tensor()) and
scales every local shard by min(1, max_norm / (norm + 1e-6)). (A first version that summed
DTensor.norm(2).full_tensor() squares per parameter and scaled with
torch.nn.utils.clip_grads_with_norm_ stepped wrong under fsdp2-tp: params.parity 9.7e-01 at
update 0 with the gradient exact; not chased further.)
float64 / float32 only (bf16 would need the shim to keep fp32 masters: refused).
"""

import argparse
import math
import os
import sys
import time
import types
from datetime import timedelta

import common  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
    from torch.distributed.tensor import DTensor  # noqa: E402
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402
except Exception as e:  # pragma: no cover - environment problem
    common.skip(f"torch.distributed.tensor.parallel cannot be imported: {e}")

CONFIGS = ("default", "token-global", "fsdp2-tp", "fsdp2-tp-default")
STACK = "torch-tp"


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def qkv_permutation(d: int, tp: int) -> torch.Tensor:
    """Rows of qkv.weight [3d, d] reordered so that the r-th of tp even row blocks is
    [q rows of r | k rows of r | v rows of r] (rank r's heads). NOTE [qkv split]"""
    w = d // tp
    perm = []
    for r in range(tp):
        for part in range(3):
            perm += list(range(part * d + r * w, part * d + (r + 1) * w))
    return torch.tensor(perm, dtype=torch.long)


def tp_block_forward(self, x):
    """gradcert.tiny_lm.Block.forward with the local number of heads (the TP tutorial's
    "adjust attention module to use the local number of heads"): qkv's output is this rank's
    [q | k | v] of heads // tp heads; proj (row-parallel) takes the local attention width."""
    B, T, C = x.shape
    hd = C // self.heads
    q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
    h_local = q.size(-1) // hd

    def split(t):
        return t.reshape(B, T, h_local, hd).transpose(1, 2)

    q, k, v = split(q), split(k), split(v)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    att = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(B, T, h_local * hd)
    h = x + self.proj(att)
    return h + self.fc_out(F.gelu(self.fc(self.ln2(h))))


def clip_global_norm(params, max_norm: float):
    """Global-norm clipping over DTensors (any mesh) and replicated plain tensors: the norm
    of the full gradients (full_tensor(), every rank calls), the protocol's coefficient
    min(1, max_norm / (norm + 1e-6)) applied to each local shard."""
    grads = [p.grad for p in params if p.grad is not None]
    sq = 0.0
    for g in grads:
        sq += float(full(g).detach().double().pow(2).sum())
    coef = min(1.0, max_norm / (math.sqrt(sq) + 1e-6))
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)


def parse_args():
    """The command line: --config and --qkv."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=CONFIGS, default="default")
    ap.add_argument("--qkv", choices=("heads", "naive"), default="heads",
                    help="heads: permute qkv rows per head before ColwiseParallel (NOTE [qkv split]); naive: a plain "
                         "ColwiseParallel of qkv (mixes q / k / v across ranks: a planted shim bug gradcert must catch)")
    return ap.parse_args()


def check_plan(plan, config: str, fsdp: bool):
    """Fails on a topology or dtype the config does not run: tp >= 2, no pp, dp 1 without FSDP2, no bfloat16."""
    if plan.pp != 1:
        common.fail(f"the torch TP shim has no pipeline stages; the plan has pp={plan.pp}")
    if plan.tp < 2:
        common.fail(f"config {config}: the plan has tp={plan.tp}; run with --tp 2 (or more)")
    if not fsdp and plan.dp != 1:
        common.fail(f"config {config} is TP only (1-D mesh); the plan has dp={plan.dp}: "
                    f"use --config fsdp2-tp for dp x tp, or run with --world {plan.tp} --tp {plan.tp}")
    if plan.dtype == torch.bfloat16:
        common.fail("bfloat16 needs fp32 master weights the shim does not keep: run float64 or float32")


def init_mesh(shim, fsdp: bool):
    """The Gloo process group and the DeviceMesh: (mesh, tp_mesh, dp_mesh, dp_group); dp_* None without FSDP2."""
    plan = shim.plan
    timeout = float(plan.spec.get("timeout", {}).get("collective_s", 60)) or 60.0
    dist.init_process_group(backend="gloo", init_method="env://", timeout=timedelta(seconds=timeout))
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != plan.dp * plan.tp:
        common.fail(f"started with world {world}, the plan's topology needs dp x tp = {plan.dp * plan.tp}")
    try:
        if fsdp:
            mesh = init_device_mesh("cpu", (plan.dp, plan.tp), mesh_dim_names=("dp", "tp"))
            tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
            dp_group = dp_mesh.get_group()
            if dp_mesh.get_local_rank() != shim.dp_rank:
                common.fail(f"rank {rank}: mesh dp rank {dp_mesh.get_local_rank()}, the protocol's {shim.dp_rank}")
        else:
            mesh = init_device_mesh("cpu", (plan.tp,), mesh_dim_names=("tp",))
            tp_mesh, dp_mesh, dp_group = mesh, None, None
    except Exception as e:
        common.skip(f"init_device_mesh('cpu', ...) on Gloo: {type(e).__name__}: {e}")
    return mesh, tp_mesh, dp_mesh, dp_group


def build_parallel_model(shim, qkv: str, tp_mesh, dp_mesh, fsdp: bool):
    """The plan's tiny LM, qkv permuted, TP-parallelized (+ fully_shard): (model, inverse permutation, qkv names)."""
    plan = shim.plan
    torch.manual_seed(int(plan.spec.get("seed", 0)))
    model = shim.build_model()
    blocks = getattr(model, "blocks", None)
    need = ("qkv", "proj", "fc", "fc_out", "ln1", "ln2")
    if blocks is None or not all(all(hasattr(b, n) for n in need) and hasattr(b, "heads") for b in blocks):
        common.fail("the torch TP shim's plan is for the tiny LM (gradcert.tiny_lm:tiny_lm): "
                    "blocks.<i>.{ln1,qkv,proj,ln2,fc,fc_out} and .heads")
    d = model.wte.weight.shape[1]
    heads = blocks[0].heads
    if heads % plan.tp or d % plan.tp or blocks[0].fc.out_features % plan.tp:
        common.fail(f"heads {heads}, d_model {d}, d_ff {blocks[0].fc.out_features} must be divisible by tp={plan.tp}")
    perm = qkv_permutation(d, plan.tp) if qkv == "heads" else torch.arange(3 * d)
    inv = torch.argsort(perm)
    qkv_names = {f"blocks.{i}.qkv.weight" for i in range(len(blocks))}
    with torch.no_grad():
        for b in blocks:
            b.qkv.weight.copy_(b.qkv.weight[perm])  # NOTE [qkv split]
    layer_plan = {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                  "fc": ColwiseParallel(), "fc_out": RowwiseParallel()}
    try:
        for b in blocks:
            b.forward = types.MethodType(tp_block_forward, b)
            parallelize_module(b, tp_mesh, layer_plan)
        if fsdp:
            from torch.distributed.fsdp import fully_shard

            for b in blocks:
                fully_shard(b, mesh=dp_mesh)
            fully_shard(model, mesh=dp_mesh)
    except Exception as e:
        common.skip(f"parallelize_module / fully_shard on CPU/Gloo: {type(e).__name__}: {e}")
    return model, inv, qkv_names


def attach_capture(shim, optimizer, model, inv, qkv_names):
    """The shim's step hooks (full, qkv un-permuted tensors), then clipping; returns the params function."""

    def canon(n, t):
        t = full(t)
        return t[inv] if n in qkv_names else t

    def grads():
        t0 = time.perf_counter()
        out = {n: canon(n, p.grad) if p.grad is not None else torch.zeros_like(canon(n, p.detach()))
               for n, p in model.named_parameters()}
        shim._excluded += time.perf_counter() - t0  # the gather is not step time
        return out

    def params():
        return {n: canon(n, p.detach()) for n, p in model.named_parameters()}

    plan = shim.plan
    shim.attach(optimizer, grads, params)  # capture first, then clip (pre-clip artifact)
    if plan.max_grad_norm > 0:
        optimizer.register_step_pre_hook(lambda *_: clip_global_norm(list(model.parameters()), plan.max_grad_norm))
    return params


def train_window(shim, model, optimizer, ids_per_slot, dp_group, token_global: bool, fsdp: bool):
    """One window: N all-reduced over the DP group, each microstep's forward and backward, optimizer.step()."""
    plan, data = shim.plan, shim.data
    D, A, ign = plan.dp, plan.accum, data.ignore_index
    batches = [data.collate(ids) for ids in ids_per_slot]
    n_r = torch.tensor([float(sum(b.valid_targets for b in batches if b is not None))], dtype=torch.float64)
    if dp_group is not None:
        dist.all_reduce(n_r, group=dp_group)
    N = int(round(float(n_r.item())))
    shim.saw_window_count(N if token_global else None)
    optimizer.zero_grad(set_to_none=True)
    S_loop = 0.0
    for a, b in enumerate(batches):
        if b is None:
            shim.tap([], None, None)
            if not fsdp:
                continue  # every TP peer has the same (empty) slot: no collective to join
            inp, lab, _ = data.dummy_batch()  # NOTE [empty microbatch] in testbed/trainer.py
            logits = model(inp)
            (F.cross_entropy(logits.reshape(-1, logits.size(-1)), lab.reshape(-1), ignore_index=ign,
                             reduction="sum") * 0.0).backward()
            continue
        logits = model(b.input)
        shim.tap(ids_per_slot[a], logits, b.labels)
        flat, tgt = logits.reshape(-1, logits.size(-1)), b.labels.reshape(-1)
        if token_global:
            S = F.cross_entropy(flat, tgt, ignore_index=ign, reduction="sum")
            loss = S * D / N
            S_loop += float(S.detach().double())
        else:
            loss = F.cross_entropy(flat, tgt, ignore_index=ign) / A
        shim.add_stack_loss(loss)
        loss.backward()
    if token_global:
        s = torch.tensor([S_loop], dtype=torch.float64)
        if dp_group is not None:
            dist.all_reduce(s, group=dp_group)
        shim.pending_loss = float(s.item()) / N if N > 0 else 0.0
    optimizer.step()


def main():
    args = parse_args()
    shim = common.Shim(STACK, args.config, packages=("torch",))
    plan, run = shim.plan, shim.run
    fsdp = args.config.startswith("fsdp2")
    token_global = args.config in ("token-global", "fsdp2-tp")
    check_plan(plan, args.config, fsdp)
    mesh, tp_mesh, dp_mesh, dp_group = init_mesh(shim, fsdp)
    model, inv, qkv_names = build_parallel_model(shim, args.qkv, tp_mesh, dp_mesh, fsdp)
    names = [n for n, _ in model.named_parameters()]
    optimizer = common.optimizer_for(model.parameters(), plan)
    params = attach_capture(shim, optimizer, model, inv, qkv_names)

    consumed = run.consumed(shim.dp_rank)
    for u in range(len(plan)):
        train_window(shim, model, optimizer, consumed[u], dp_group, token_global, fsdp)

    facts = [f"torch {torch.__version__} DTensor TP (parallelize_module: qkv/fc colwise, proj/fc_out rowwise) "
             f"on Gloo, mesh {tuple(mesh.mesh.shape)} {mesh.mesh_dim_names}",
             "qkv rows permuted per head before ColwiseParallel (NOTE [qkv split]); artifacts un-permuted"
             if args.qkv == "heads" else "qkv: plain ColwiseParallel (--qkv naive: q/k/v mixed across ranks)",
             "FSDP2 fully_shard over mesh['dp'] per block + root" if fsdp else "no DP",
             "loss sum CE * D / N (N all-reduced over dp)" if token_global else "loss mean CE per microbatch / A",
             f"{len(names)} parameters"]
    shim.finish(params, notes="; ".join(facts))
    common.shutdown()


if __name__ == "__main__":
    main()
