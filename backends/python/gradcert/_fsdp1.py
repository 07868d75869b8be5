"""FSDP1 (`FullyShardedDataParallel`) under `gradcert observe`: every FlatParameter's shards
gathered into the model's own parameters, under its own names (NOTE [FSDP1 shards]).

NOTE [FSDP1 shards] FSDP1 keeps each unit's parameters as one FlatParameter, sharded across
its ranks (padded to a multiple of the world; with use_orig_params=True the original
parameters are 1-D views into this rank's piece, alignment padding between them). The recorder
all-gathers each unit's local shard of the parameters (and of the gradient after the
reduce-scatter) within the unit's process group, cuts the padding, and splits the flat tensor by
the FlatParameter's own _fqns / _shapes / _numels_with_padding into full tensors named as the
unwrapped model names them (no _fsdp_wrapped_module.). Every call is a collective: the
recorder makes them where every rank is (the optimizer's step hooks, clip_grad_norm_, watch()).
The reference then sees FSDP1 jobs exactly as DDP ones (whole tensors, written by rank 0).
These are FSDP1's private attributes (torch 2.13): a torch that renames them fails here with
the attribute's name, never silently.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp._common_utils import _get_module_fsdp_state, _is_fsdp_flattened, clean_tensor_name


def fsdp1_root(model: nn.Module):
    """The outermost FullyShardedDataParallel of the model the job passed to watch(), or None."""
    for _ in range(8):
        if type(model).__name__ == "FullyShardedDataParallel" and type(model).__module__.startswith("torch.distributed"):
            return model
        inner = getattr(model, "module", None) if type(model).__name__ in ("DistributedDataParallel",) else \
            getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return None
        model = inner
    return None


def _iter_fsdp_handles(model: nn.Module):
    """Yield (handle, prefix) for every FlatParamHandle under `model`, in a rank-consistent order.

    prefix = canonical name of the module the FlatParameter's `_fqns` are relative to
    (handle._fully_sharded_module == FSDP_instance._fsdp_wrapped_module for the wrapper API).
    """
    seen = set()
    mod_names = {}
    for name, m in model.named_modules(remove_duplicate=False):
        mod_names.setdefault(id(m), name)
    for name, m in model.named_modules():
        state = _get_module_fsdp_state(m)
        if state is None or state._handle is None or id(state._handle) in seen:
            continue
        handle = state._handle
        seen.add(id(handle))
        owner = mod_names.get(id(handle._fully_sharded_module), name)
        yield handle, clean_tensor_name(owner + "." if owner else "")


def fsdp1_flat_param_names(model: nn.Module) -> dict:
    """FlatParameter -> list of canonical FQNs it contains (what the optimizer holds when
    use_orig_params=False). Shared (tied) aliases are not listed (see _shared_param_infos)."""
    return {h.flat_param: [clean_tensor_name(p + f) for f in h.flat_param._fqns]
            for h, p in _iter_fsdp_handles(model)}


def _gather_flat(local: torch.Tensor, handle) -> torch.Tensor:
    """All-gather this rank's padded flat shard -> unpadded unsharded flat tensor."""
    fp = handle.flat_param
    ws = handle.world_size
    out = torch.empty(local.numel() * ws, dtype=local.dtype, device=local.device)
    dist.all_gather_into_tensor(out, local.contiguous(), group=handle.process_group)
    return out[: fp._unpadded_unsharded_size.numel()]


def _split(flat: torch.Tensor, fp) -> list[torch.Tensor]:
    """Split an unpadded unsharded flat tensor into per-original-param tensors
    (drops use_orig_params=True alignment-padding segments)."""
    numels_wp = getattr(fp, "_numels_with_padding", fp._numels)
    mask = getattr(fp, "_is_padding_mask", [False] * len(numels_wp))
    pieces = torch.split(flat, list(numels_wp))
    real = [t for t, pad in zip(pieces, mask) if not pad]
    if len(real) != len(fp._shapes):
        raise RuntimeError(f"FSDP1 flat parameter {fp._fqns}: {len(real)} pieces for {len(fp._shapes)} shapes")
    return [t.view(s) for t, s in zip(real, fp._shapes)]


def _local_shard(handle, which: str):
    """(local padded 1-D shard tensor or None, per-param has-grad flags) for this rank."""
    fp = handle.flat_param
    n = len(fp._fqns)
    sharded = handle.uses_sharded_strategy
    if which == "param":
        if sharded and not handle.is_sharded(fp):
            # currently unsharded (e.g. SHARD_GRAD_OP between fwd and bwd, summon ctx):
            # fall back on the full-precision local shard FSDP keeps
            return fp._local_shard, [True] * n
        return fp.detach(), [True] * n
    # which == "grad"
    if handle._use_orig_params:
        # Build from the original params' .grad (1-D views into fp.grad for in-shard params);
        # this respects user re-assignment / None-ing of individual orig grads.
        flat = fp.detach()
        if sharded and not handle.is_sharded(fp):
            flat = fp._local_shard
        buf = None
        flags = []
        for p, spi, shp in zip(fp._params, fp._shard_param_infos, fp._shapes):
            g = p.grad
            has = g is not None and spi.in_shard
            flags.append(has)
            if has:
                if buf is None:
                    buf = torch.zeros(flat.numel(), dtype=g.dtype, device=g.device)
                # sharded: g is a 1-D view of the in-shard slice; NO_SHARD: g has the original
                # shape and offset_in_shard indexes the whole (unsharded) flat param
                buf[spi.offset_in_shard: spi.offset_in_shard + spi.numel_in_shard] = g.reshape(-1)
        return buf, flags
    g = handle.sharded_grad  # _cpu_grad > _saved_grad_shard > .grad
    return (None if g is None else g.detach()), [g is not None] * n


@torch.no_grad()
def fsdp1_full_tensors(model: nn.Module, which: str = "grad", include_unmanaged: bool = True,
                       include_shared_aliases: bool = False) -> dict[str, torch.Tensor | None]:
    """name -> full tensor (fresh copy, detached) on every rank. which in {'grad','param'}.
    A grad is None iff no rank holds a gradient for it (use_orig_params=False: per FlatParameter)."""
    out: dict[str, torch.Tensor | None] = {}
    for handle, prefix in _iter_fsdp_handles(model):
        fp = handle.flat_param
        names = [clean_tensor_name(prefix + f) for f in fp._fqns]
        local, flags = _local_shard(handle, which)
        if handle.uses_sharded_strategy and handle.world_size > 1:
            # consensus on which params have a grad anywhere (collective on every rank)
            f = torch.tensor([int(x) for x in flags] + [int(local is not None)],
                             dtype=torch.int32, device=fp.device)
            dist.all_reduce(f, op=dist.ReduceOp.MAX, group=handle.process_group)
            flags = [bool(x) for x in f[:-1].tolist()]
            any_local = bool(f[-1].item())
            if not any_local:
                tensors = [None] * len(names)
            else:
                if local is None:  # this rank has no grad but others do -> contribute zeros
                    local = torch.zeros(fp._sharded_size, dtype=fp.dtype, device=fp.device)
                tensors = _split(_gather_flat(local, handle), fp)
        else:  # NO_SHARD or world_size 1: local is already the full unpadded flat tensor
            tensors = [None] * len(names) if local is None else _split(
                local[: fp._unpadded_unsharded_size.numel()], fp)
        for nm, t, has in zip(names, tensors, flags):
            out[nm] = t.clone() if (t is not None and has) else None
        if include_shared_aliases:
            for spi in fp._shared_param_infos:
                alias = clean_tensor_name(prefix + (spi.module_name + "." if spi.module_name else "") + spi.param_name)
                prim = clean_tensor_name(prefix + (spi.prim_module_name + "." if spi.prim_module_name else "") + spi.prim_param_name)
                out[alias] = out.get(prim)
    if include_unmanaged:  # params FSDP does not manage (ignored_modules / ignored_states)
        for name, p in model.named_parameters():
            if getattr(p, "_is_flat_param", False) or _is_fsdp_flattened(p):
                continue
            t = p if which == "param" else p.grad
            out[clean_tensor_name(name)] = None if t is None else t.detach().clone()
    return out
