"""The PyTorch adapters' checkpoint legs for resumed runs, with the planted resume bugs: part
of the test bed (backends/python/testbed/), not of the installed `gradcert` package. The
protocol's side (the environment, gradcert.json) is gradcert/ref/checkpoint.py, whose names
this module re-exports (the trainer calls `ckpt.Resume()`).

The adapters save and load with torch.distributed.checkpoint (DCP): the model's and the
optimizer's state dicts as torch.distributed.checkpoint.state_dict gives them (canonical
parameter names; DTensor shards for FSDP2, whole tensors for DDP, which DCP saves once),
saved by every rank and loaded with DCP's resharding, so a DDP checkpoint loads into FSDP2
and a world-2 one into world 3. Rank 0 adds gradcert.json: the updates done, the optimizer's
step counter, the sampler position (the next window), the run's nonce.

gradcert does not trust this module's load: after the first leg, gradcert.ref.dcp_export
reads the files on disk into gradcert's own layout-independent form and resume.checkpoint
judges them; the checks after the resume judge the load.
"""

from __future__ import annotations

import glob
import os
import time

import torch
import torch.distributed as dist

from gradcert.ref.checkpoint import FORMAT, MANIFEST, SCHEMA, Resume, read_manifest  # noqa: F401
from gradcert.ref.client import ProtocolError, run_nonce, write_json


def _torch_optimizer(optimizer):
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ProtocolError("a resumed run saves the optimizer with torch.distributed.checkpoint, which needs a "
                            f"torch.optim optimizer (this one is {type(optimizer).__name__}; use --optim torch)")


def _state(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, optimizer)


def optimizer_step(optimizer, default: int) -> int:
    """The optimizer's own step counter (AdamW's "step" per parameter; the largest), else `default`."""
    steps = [float(st["step"]) for st in optimizer.state.values() if "step" in st]
    return int(round(max(steps))) if steps else default


def save(plan, model, optimizer, updates_done: int, save_dir: str, backend: str, mutant: str | None = None) -> float:
    """Every rank: save model + optimizer state with DCP into `save_dir`; rank 0 then writes
    gradcert.json. Returns the seconds the save took (until every rank had saved)."""
    import torch.distributed.checkpoint as dcp

    _torch_optimizer(optimizer)
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(save_dir, exist_ok=True)
    model_sd, optim_sd = _state(model, optimizer)
    # resume-optimizer-unsaved: the planted bug saves the weights only.
    state = {"model": model_sd} if mutant == "resume-optimizer-unsaved" else {"model": model_sd, "optim": optim_sd}
    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=save_dir)
    dist.barrier()
    seconds = time.perf_counter() - t0
    if mutant == "resume-shard-unwritten" and rank == world - 1:  # the planted bug: this rank's files are gone
        for f in glob.glob(os.path.join(save_dir, f"__{rank}_*.distcp")):
            os.remove(f)
    dist.barrier()
    if rank == 0:
        epoch, index = divmod(updates_done, plan.windows_per_epoch)  # the next window's place (plan.cpp)
        write_json(os.path.join(save_dir, MANIFEST), {
            "schema": SCHEMA, "format": FORMAT, "backend": backend, "world": world, "updates_done": updates_done,
            "optimizer_step": optimizer_step(optimizer, updates_done),
            "sampler": {"epoch": epoch, "index_in_epoch": index},
            "save_seconds": seconds, "nonce": run_nonce()})
    dist.barrier()
    return seconds

def load(plan, model, optimizer, resume_from: str, mutant: str | None = None) -> int:
    """Every rank: load the checkpoint into `model` / `optimizer` (DCP reshards to this
    world and wrapping). Returns the first update this leg runs: the position of the
    sampler (the next window), which the planted sampler bugs move."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    _torch_optimizer(optimizer)
    m = read_manifest(resume_from, run_nonce())
    first = int(m["updates_done"])
    if not 1 <= first < len(plan):
        raise ProtocolError(f"{resume_from}/{MANIFEST}: updates_done {first} is outside the plan's 1..{len(plan) - 1}")
    model_sd, optim_sd = _state(model, optimizer)  # initialises the optimizer's state (zero step, lr 0)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=resume_from)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if mutant == "resume-step-reset":  # the planted bug: the counters are not restored
        for st in optimizer.state.values():
            if "step" in st and isinstance(st["step"], torch.Tensor):
                st["step"].zero_()
    return first


def sampler_window(plan, first: int, update: int, mutant: str | None) -> int:
    """The plan window whose ids a resumed leg consumes at `update` (>= first): the same
    one, unless a planted sampler bug restarts update `first`'s epoch or skips to the next
    (past the plan's end it wraps to the plan's start: the plan holds no later epoch's order,
    and the bug it plants, the rest of an epoch never consumed, is at the resume either way)."""
    if mutant not in ("resume-sampler-restart", "resume-sampler-skip"):
        return update
    start = (first // plan.windows_per_epoch) * plan.windows_per_epoch
    if mutant == "resume-sampler-skip":
        start += plan.windows_per_epoch
    return (start + (update - first)) % len(plan)
