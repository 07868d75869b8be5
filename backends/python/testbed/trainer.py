"""The PyTorch adapters' trainer (backends/PROTOCOL.md, version 1): part of the test bed
(backends/python/testbed/), not of the installed `gradcert` package.

The loss sum S; the D*S/N rule with the planted bugs of testbed/mutants.py; the optimizer;
and the adapters' training loop, with their own checkpoint legs (testbed/checkpoint.py). The
model they train is the package's (the plan's factory, else the built-in tiny LM
`gradcert.tiny_lm:tiny_lm`, gradcert/tiny_lm.py). The protocol itself (plan.json,
dataset.json, initial.safetensors, collation, capturing the reduced gradient, the artifact
writers) lives in the client library gradcert/ref/client.py, which any stack can use.

Everything here is plain PyTorch; the strategy files (torch_ddp.py, torch_fsdp2.py,
torch_fsdp1.py) only decide how the model is wrapped and how gradients are reduced. They run
as scripts from backends/python/, so `from testbed import trainer` finds this folder.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gradcert import _env
from gradcert.ref import PROTOCOL_VERSION  # noqa: F401
from gradcert.ref import client
from gradcert.ref import factory as factory_mod
from gradcert.ref.reference import optimizer_step

from . import checkpoint as ckpt
from . import mutants

EXIT_SKIP = 77  # "this stack cannot run here": the gradcert tests turn it into a SKIP
DTYPES = client.DTYPES


def fail(msg: str, code: int = 2):
    print(f"gradcert adapter: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# --------------------------------------------------------------------------------------
# The loss sum (the model itself: gradcert/tiny_lm.py, or the plan's factory)
# --------------------------------------------------------------------------------------


def loss_sum(model: nn.Module, input: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """S: the sum of token cross-entropies over valid targets (logits in float32 for bf16)."""
    logits = factory_mod.logits_of(model(input))
    if logits.dtype == torch.bfloat16:
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=ignore_index,
                           reduction="sum")


# --------------------------------------------------------------------------------------
# Inputs (gradcert/ref/client.py), with adapter-style errors
# --------------------------------------------------------------------------------------


def open_run() -> client.Run:
    """The run's inputs from the GRADCERT_* environment; a bad input exits 2 naming it."""
    try:
        return client.Run.from_env()
    except client.ProtocolError as e:
        fail(str(e))


def build_model(run: client.Run, dtype: torch.dtype) -> nn.Module:
    """The plan's model (spec.model.factory, else the tiny LM) from initial.safetensors, on
    this rank's device (NOTE [device])."""
    try:
        return run.build_model(dtype).to(device())
    except (client.ProtocolError, factory_mod.FactoryError) as e:
        fail(str(e))


@functools.lru_cache(maxsize=None)
def device() -> torch.device:
    """The adapters' side of NOTE [device] (conformance/launch/cuda_probe.cpp): GRADCERT_DEVICE
    cpu (default) or cuda, the latter cuda:<LOCAL_RANK mod the GPUs present>. Read once per
    process (the loop asks per microbatch)."""
    d = os.environ.get(_env.DEVICE, "cpu") or "cpu"
    if d == "cpu":
        return torch.device("cpu")
    if d != "cuda":
        fail(f"GRADCERT_DEVICE={d!r}: expected cpu or cuda")
    if not torch.cuda.is_available():
        fail(f"GRADCERT_DEVICE=cuda, but this Python's torch {torch.__version__} sees no CUDA device "
             f"(torch.version.cuda={torch.version.cuda}): run the stack with a CUDA build of torch")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def allreduce_sum_f64(values, group=None):
    """Sums a few scalars over all ranks (float64 tensor; counts are exact below 2^53), on the
    rank's device (NCCL reduces CUDA tensors only)."""
    t = torch.tensor(values, dtype=torch.float64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.tolist()


# --------------------------------------------------------------------------------------
# The optimizer (PROTOCOL.md; model.cpp optimizer_step)
# --------------------------------------------------------------------------------------


class _Handle:
    def __init__(self, hooks, hook):
        self.hooks, self.hook = hooks, hook

    def remove(self):
        if self.hook in self.hooks:
            self.hooks.remove(self.hook)


class HandOptimizer:
    """Elementwise SGD / AdamW: the reference's own step (gradcert.ref.reference.optimizer_step,
    as conformance/model/model.cpp writes it), applied per parameter. Works on
    plain tensors and on DTensors (the arithmetic is elementwise, so shards are fine).
    Step pre-hooks as torch.optim.Optimizer has them (for client.GradRecorder)."""

    def __init__(self, params, opt: dict):
        self.params = list(params)
        self.opt = opt
        self.state = {}
        self.step_count = 0
        self._pre_hooks = []

    def register_step_pre_hook(self, hook):
        self._pre_hooks.append(hook)
        return _Handle(self._pre_hooks, hook)

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for hook in list(self._pre_hooks):
            hook(self, (), {})
        self.step_count += 1
        for p in self.params:
            optimizer_step(self.opt, self.step_count, p, p.grad, self.state.setdefault(id(p), {}))


def make_optimizer(params, opt: dict, kind: str):
    """kind 'torch': torch.optim.SGD / AdamW (the realistic choice; their update rules are
    the protocol's: SGD dampening 0, first momentum buffer = gradient, weight decay added
    to the gradient; AdamW decoupled decay, step lr/bc1, denom sqrt(v)/sqrt(bc2)+eps, which
    differs from sqrt(v/bc2)+eps by rounding only). kind 'hand': HandOptimizer."""
    params = list(params)
    if kind == "hand":
        return HandOptimizer(params, opt)
    if kind != "torch":
        fail(f"unknown optimizer implementation {kind!r} (torch | hand)")
    # foreach=False: per-parameter kernels (DTensor-safe, and the same arithmetic order).
    if opt["name"] == "sgd":
        return torch.optim.SGD(params, lr=opt["lr"], momentum=opt["momentum"], dampening=0,
                               weight_decay=opt["weight_decay"], nesterov=False, foreach=False)
    if opt["name"] == "adamw":
        return torch.optim.AdamW(params, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"],
                                 weight_decay=opt["weight_decay"], amsgrad=False, foreach=False)
    fail(f"unknown optimizer {opt['name']!r}")


# --------------------------------------------------------------------------------------
# Process group, strategies, the loop
# --------------------------------------------------------------------------------------


def init_process_group(run: client.Run):
    """Gloo on CPU; on CUDA NCCL with one GPU per rank, else Gloo on CUDA tensors (NCCL refuses
    two ranks on one GPU); TF32 off unless the spec's `tf32`. Rendezvous from torchrun's
    environment, bounded collectives."""
    plan = run.plan
    timeout_s = float(plan.spec.get("timeout", {}).get("collective_s", 60.0)) or 60.0
    dev, backend = device(), "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        tf32 = bool(plan.spec.get("tf32", False))
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if int(os.environ.get("WORLD_SIZE", "1")) <= torch.cuda.device_count():
            backend = "nccl"
    dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    world, rank = dist.get_world_size(), dist.get_rank()
    if plan.tp != 1 or plan.pp != 1:
        fail(f"this adapter is data parallel only; the plan has tp={plan.tp} pp={plan.pp}")
    if world != plan.dp:
        fail(f"started with world {world}, the plan's topology needs {plan.dp} ranks")
    return rank, world


def shutdown():
    """NOTE [teardown] After the artifacts are written: a barrier, destroy_process_group,
    then os._exit(0). Once in ~5 runs (FSDP2, world 3, torch 2.13 CPU) a rank died at exit
    with "terminate called without an active exception" (SIGABRT) after writing every
    artifact: Gloo worker threads of process groups that outlive destroy_process_group
    (DeviceMesh / FSDP state keep references) being torn down during interpreter
    finalization (cf. pytorch/pytorch PR 179291). Skipping finalization avoids the race;
    everything this process owes gradcert is on disk by then (written atomically)."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class Strategy:
    """How a parallel wrapper takes part in the shared training loop (train())."""

    name = "?"
    #: must a rank with an empty (non-final) microbatch still run a forward/backward?
    #: (yes when the forward itself runs collectives, e.g. FSDP's parameter all-gathers)
    empty_microsteps_need_collectives = True

    def microstep(self, last: bool):
        """The context a microstep runs in (e.g. DDP no_sync() unless last)."""
        return contextlib.nullcontext()

    def full_grads(self) -> dict:
        """Canonical name -> the full reduced gradient (every rank calls; may gather)."""
        raise NotImplementedError

    def full_params(self) -> dict:
        raise NotImplementedError

    def replica_params(self):
        """(name, tensor) this rank holds whole after the step (a DDP replica: every
        parameter), for replicas.agree; empty where a rank holds shards."""
        return []

    def clip_grad_norm(self, params, max_norm: float):
        """Global-norm clipping of the optimizer's parameters' gradients (every rank)."""
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)


def add_common_args(ap: argparse.ArgumentParser):
    ap.add_argument("--mutant", choices=list(mutants.MUTANTS), default=None, metavar="ID",
                    help="plant a bug (for gradcert's own tests): " +
                         "; ".join(f"{k} = {v}" for k, v in mutants.MUTANTS.items()))
    ap.add_argument("--wrong", dest="mutant", choices=list(mutants.MUTANTS), help=argparse.SUPPRESS)  # deprecated
    ap.add_argument("--optim", choices=["torch", "hand"], default=os.environ.get(_env.PY_OPTIM, "torch"),
                    help="torch.optim SGD/AdamW (default) or the elementwise hand-written copy of model.cpp")


def backend_name(adapter: str, mutant: str | None) -> str:
    return adapter + (f"+mutant={mutant}" if mutant else "")


def _resume_legs(run: client.Run, model: nn.Module, optimizer, mutant: str | None, masters: dict | None):
    """The resumed run's legs (testbed/checkpoint.py), checkpoint loaded: (resume, first update, end update)."""
    plan = run.plan
    try:
        resume = ckpt.Resume()
    except client.ProtocolError as e:
        fail(str(e))
    if mutant in mutants.RESUME_MUTANTS and not resume.active:
        fail(f"--mutant {mutant} plants its bug in a checkpoint: run it under gradcert run --resume-at K")
    if resume.active and masters:
        fail("this adapter keeps bf16 master weights outside the model, which its DCP checkpoint does not hold: "
             "a resumed run needs float64 / float32 here (or FSDP2's bf16 policy)")
    if resume.active and run.sampler == "own":
        fail("GRADCERT_SAMPLER=own with a resumed run: the stack's own sampler position is not checkpointed yet")
    first, end = 0, len(plan)
    if resume.resume_from:
        try:
            first = ckpt.load(plan, model, optimizer, resume.resume_from, mutant)
        except client.ProtocolError as e:
            fail(str(e))
    if resume.save_at is not None:
        if not first < resume.save_at < len(plan):
            fail(f"GRADCERT_SAVE_AT={resume.save_at}: expected {first + 1}..{len(plan) - 1} (updates before the save)")
        end = resume.save_at
    return resume, first, end


def _register_clipping(plan: client.Plan, model: nn.Module, strategy: Strategy, optimizer, mutant: str | None,
                       masters: dict | None):
    """Registers the clipping pre-hook where max_grad_norm > 0: (its handle or None, clip-per-rank instead)."""
    clip_handle = None
    # clip-per-rank: each rank clips its own accumulated gradient before the reduction (a
    # replica whose wrapper reduces inside backward cannot do it; the mutant accumulates
    # under no sync and reduces by hand, so what the stack steps on is the mean of per-rank
    # clipped gradients, not the clipped mean).
    per_rank_clip = mutant == "clip-per-rank"
    if per_rank_clip and not plan.max_grad_norm > 0:
        fail("--mutant clip-per-rank needs optimizer.max_grad_norm > 0 in the spec")
    if plan.max_grad_norm > 0 and not per_rank_clip:
        opt_params = [m for _, m in masters.values()] if masters else [p for p in model.parameters()]
        clip_handle = optimizer.register_step_pre_hook(
            lambda *_: strategy.clip_grad_norm(opt_params, plan.max_grad_norm))
    return clip_handle, per_rank_clip


def _backward_window(model: nn.Module, strategy: Strategy, data, batches: list, scale_of, per_rank_clip: bool) -> float:
    """Forward and backward of each microstep, S * scale_of(a, batch); returns S_r, this rank's S."""
    S_r = 0.0
    for a, b in enumerate(batches):
        last = a == len(batches) - 1 and not per_rank_clip
        if b is None and not (last or strategy.empty_microsteps_need_collectives):
            continue  # nothing to add, and no collective to join (e.g. DDP under no_sync)
        with strategy.microstep(last):
            if b is None:
                # NOTE [empty microbatch] This rank has no example here, but the wrapper
                # reduces gradients (and, for FSDP, gathers parameters) inside forward and
                # backward, so it must run them like its peers: a one-token batch with no
                # target, loss x 0. Every parameter stays in the graph (so DDP/FSDP hooks
                # fire for all of them) and the gradient it adds is exactly zero.
                inp, lab, _ = on_device(data.dummy_batch())
                (loss_sum(model, inp, lab, data.ignore_index) * 0.0).backward()
                continue
            scale = scale_of(a, b)
            S = loss_sum(model, b.input, b.labels, data.ignore_index)
            (S * scale).backward()
            S_r += float(S.detach().to(torch.float64))
    return S_r


def _clip_per_rank(model: nn.Module, max_norm: float, world: int):
    """The clip-per-rank mutant: each rank clips its own gradient, then the mean by hand (all_reduce / world)."""
    local = [p for p in model.parameters()]
    for p in local:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    torch.nn.utils.clip_grad_norm_(local, max_norm, foreach=False)
    for p in local:
        dist.all_reduce(p.grad)
        p.grad.div_(world)


def _record_dropped(writer: client.ArtifactWriter, strategy: Strategy, plan: client.Plan, u: int, t0: float):
    """Writes update u as a window the mutant dropped: nothing consumed, a zero gradient, the parameters."""
    params = strategy.full_params()
    grads = {n: torch.zeros_like(p) for n, p in params.items()}
    writer.record(u, [[] for _ in range(plan.accum)], 0.0, 0, 0.0, 0, time.perf_counter() - t0, grads, params)


def _timed_step(optimizer, recorder, masters: dict | None, sync, t0: float) -> float:
    """The optimizer step (bf16: on the fp32 masters, copied back); returns the update's step seconds."""
    if masters:
        for p, master in masters.values():
            master.grad = p.grad.detach().to(master.dtype)
    sync()
    t_compute = time.perf_counter() - t0
    t1 = time.perf_counter()
    optimizer.step()  # pre-hooks: the recorder captures the full gradient, then clipping
    if masters:
        with torch.no_grad():
            for p, master in masters.values():
                p.copy_(master.to(p.dtype))
    sync()
    return t_compute + (time.perf_counter() - t1 - recorder.seconds)


def train(run: client.Run, rank: int, world: int, model: nn.Module, strategy: Strategy, optimizer,
          writer: client.ArtifactWriter, mutant: str | None = None, masters: dict | None = None):
    """The protocol's loop: per update, N by all-reducing the local valid-target counts,
    backward of D*S_{r,a}/N per microstep (the wrapper averages over D and the microsteps
    accumulate; `mutant` changes the scale, see testbed/mutants.py), one optimizer
    step, artifacts. The reduced gradient is captured by a client.GradRecorder in the
    optimizer's step pre-hook; `optimizer.max_grad_norm` > 0 clips in a later pre-hook
    (the artifact stays pre-clip). `masters` (bf16): name -> (param, fp32 master); the
    optimizer steps the masters and the bf16 params are copied from them.

    A resumed run's legs (testbed/checkpoint.py): GRADCERT_RESUME_FROM loads the
    checkpoint (before any hook is registered: DCP's state-dict helpers run one zero-lr
    step) and starts at the update it names; GRADCERT_SAVE_AT=K stops after update K-1 and
    saves with DCP (every rank)."""
    plan, data = run.plan, run.dataset
    consumed_all = run.consumed(rank)
    window_ids = [run.consumed(r) for r in range(plan.dp)]  # every DP rank's (a window's last microstep)
    resume, first, end = _resume_legs(run, model, optimizer, mutant, masters)
    recorder = client.GradRecorder(optimizer, source=strategy.full_grads)  # gathers outside the timed region
    sync = torch.cuda.synchronize if device().type == "cuda" else (lambda: None)  # CUDA runs ahead of the host
    clip_handle, per_rank_clip = _register_clipping(plan, model, strategy, optimizer, mutant, masters)
    for u in range(first, end):
        t0 = time.perf_counter()
        partial = plan.partial(u)
        if mutants.drops_window(mutant, partial):  # every rank drops it alike: no collective to join
            _record_dropped(writer, strategy, plan, u, t0)
            continue
        consumed = consumed_all[ckpt.sampler_window(plan, first, u, mutant) if resume.resume_from else u]
        batches = [on_device(data.collate(ids)) for ids in consumed]
        n_r = sum(b.valid_targets for b in batches if b is not None)
        rows_r = sum(data.rows_with_targets(ids) for ids in consumed)
        N_all, rows_all = allreduce_sum_f64([n_r, rows_r])  # every rank joins, zero-example ranks too
        N = mutants.window_count(mutant, int(round(N_all)), int(round(rows_all)))
        last_a = max((a for r in range(plan.dp) for a, ids in enumerate(window_ids[r][u])
                      if ids and data.rows_with_targets(ids) > 0), default=0)
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)

        def scale_of(a, b):
            """The loss scale of microstep a (the protocol's D / N, or the mutant's)."""
            return mutants.loss_scale(mutant, plan.dp, plan.accum, N, n_r, b.valid_targets, partial, a, last_a)

        S_r = _backward_window(model, strategy, data, batches, scale_of, per_rank_clip)
        if per_rank_clip:
            _clip_per_rank(model, plan.max_grad_norm, world)
        step_seconds = _timed_step(optimizer, recorder, masters, sync, t0)
        grads = recorder.pop()
        S_global = allreduce_sum_f64([S_r])[0]
        loss = S_global / N if N > 0 else 0.0
        params = strategy.full_params()
        writer.record(u, consumed, S_r, mutants.rank_count(mutant, n_r, rows_r), loss, N, step_seconds, grads, params,
                      replicas=client.replica_digests(strategy.replica_params()))
    recorder.remove()
    if clip_handle is not None:
        clip_handle.remove()
    if resume.save_at is not None:
        try:
            ckpt.save(plan, model, optimizer, end, resume.save_dir, writer.backend, mutant)
        except client.ProtocolError as e:
            fail(str(e))
    writer.memory = memory_per_rank(model, optimizer, masters)


def device_note() -> str:
    """What the report says of the device (NOTE [device]): "" on the CPU."""
    dev = device()
    if dev.type == "cpu":
        return ""
    tf32 = "on" if torch.backends.cuda.matmul.allow_tf32 else "off"
    return (f"; device {dev} of {torch.cuda.device_count()} GPU(s) ({torch.cuda.get_device_name(dev)}), "
            f"process group {dist.get_backend()}, TF32 {tf32}")


def on_device(b):
    """A collated batch on the rank's device (None stays None)."""
    if b is None or device().type == "cpu":
        return b
    return b._replace(input=b.input.to(device()), labels=b.labels.to(device()))


def _local(t):
    """The shard a rank really holds: a DTensor's local tensor, else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def memory_per_rank(model: nn.Module, optimizer, masters: dict | None) -> dict:
    """NOTE [adapter memory] Per rank, gathered to every rank: the exact storage of the
    model state this rank holds (parameters, gradients, fp32 masters, optimizer state;
    local shards of DTensors / FlatParameters, shared storage once) and the process
    high-water mark (ru_maxrss: the whole process, Python and libraries included, so it
    compares stacks with each other, not with gradcert's tracked tensor peaks)."""
    import resource

    seen, total = set(), 0

    def add(t):
        nonlocal total
        if not isinstance(t, torch.Tensor):
            return
        t = _local(t)
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            return
        seen.add(st.data_ptr())
        total += st.nbytes()

    for p in model.parameters():
        add(p)
        add(p.grad)
    for p, master in (masters or {}).values():
        add(master)
        add(master.grad)
    for st in getattr(optimizer, "state", {}).values():
        for v in st.values():
            add(v)
    dev = device()
    if dev.type == "cuda":  # the caching allocator's peak over the run, on this rank's GPU
        peak, kind = float(torch.cuda.max_memory_allocated(dev)), (
            f"CUDA caching allocator peak allocated, per rank (reserved peak {torch.cuda.max_memory_reserved(dev)} B "
            f"on rank {dist.get_rank()})")
    else:
        peak, kind = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0, "process high-water (ru_maxrss), per rank"
    mine = [float(total), peak, kind]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {"model_state_bytes": [e[0] for e in everyone],
            "peak_memory_bytes": [e[1] for e in everyone],
            "peak_memory_kind": everyone[0][2]}
