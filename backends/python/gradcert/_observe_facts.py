"""What `gradcert observe` reads off the user's job, for the recorder in gradcert.observe.

  - the objects: the model and optimizer under their wrappers (DDP / FSDP / DeepSpeed /
    torch.compile; accelerate's, Lightning's and DeepSpeed's optimizers), a model factory as
    the name the reference imports it by, the versions of the stack;
  - a forward's inputs as gradcert's examples: shifted targets, right padding cut, each
    example keyed by a digest of its content;
  - the model's dropout (turned off for the observed updates) and a Hugging Face model's
    config, with the script the reference rebuilds it from.

Stateless helpers: everything that records (hooks, files, the clip wrapper) is in observe.py.
"""

from __future__ import annotations

import hashlib
import os
import sys

import torch
import torch.nn as nn

IGNORE = -100
DROPOUT_TYPES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
# Float attributes that HF attention code reads as its dropout probability (not modules).
DROPOUT_ATTRS = ("attention_dropout", "attn_dropout", "dropout", "dropout_p", "dropout_prob", "attn_pdrop")


class ObserveError(RuntimeError):
    """Something the integration cannot record; the job is ended with this message."""

    __module__ = "gradcert.observe"  # its public home: tracebacks name it as before the split


# --------------------------------------------------------------------------------------
# Unwrapping the job's objects
# --------------------------------------------------------------------------------------


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module whose forward sees the inputs and whose parameter names are canonical:
    through DDP / FSDP1 / DeepSpeed engines (`.module`), torch.compile (`._orig_mod`)."""
    for _ in range(8):
        kind = type(model).__name__
        if kind in ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel", "DeepSpeedEngine",
                    "PipelineEngine") and isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model
    return model


def unwrap_optimizer(optimizer):
    """The torch.optim.Optimizer that steps (AcceleratedOptimizer, LightningOptimizer and
    DeepSpeed's wrappers hold it as `.optimizer`)."""
    for _ in range(8):
        # AcceleratedOptimizer subclasses torch.optim.Optimizer without its state (no hooks):
        # a wrapper is whatever holds another optimizer, subclass or not.
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or not hasattr(inner, "param_groups"):
            break
        optimizer = inner
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ObserveError(f"gradcert.watch: {type(optimizer).__name__} is not a torch.optim.Optimizer and wraps none "
                           f"(pass the optimizer the job steps)")
    return optimizer


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _is_dtensor(t) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "placements")


def qualified(obj) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    if t.__module__.startswith("torch.distributed.fsdp"):  # FSDP2's FSDP<Class>: the user's class
        t = next((b for b in t.__mro__[1:] if not b.__module__.startswith("torch.distributed")), t)
    return f"{t.__module__}.{t.__qualname__}"


def model_max_len(model: nn.Module) -> int:
    """The sequence length a model was built for, where it says (HF configs, nanoGPT's
    block_size, an attribute); 0 when it does not (then the longest row seen serves)."""
    names = ("n_positions", "max_position_embeddings", "block_size", "max_len", "max_seq_len")
    for holder in (getattr(model, "config", None), model):
        for name in names:
            v = getattr(holder, name, None) if holder is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return 0


def loader_facts(loader, accum) -> dict:
    """The job's batch settings from its DataLoader and accumulation steps (either may be None):
    micro, expect_batch (micro x accum x world), dataset_size, windows_per_epoch, drop_last."""
    import math

    import torch.distributed as dist

    facts = {}
    if loader is None:
        return facts
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    accum = int(accum or 1)
    micro = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    facts.update(source="the job's DataLoader" + (f" and accum {accum}" if accum else ""), accum=accum,
                 drop_last=bool(getattr(loader, "drop_last", False)))
    if micro:
        facts.update(micro=int(micro), expect_batch=int(micro) * accum * world)
    try:
        facts["dataset_size"] = len(loader.dataset)
        facts["windows_per_epoch"] = math.ceil(len(loader) / accum)
    except (TypeError, AttributeError):
        pass
    return facts


def factory_string(factory) -> str | None:
    """A factory callable as FILE.py:FUNC (a function of a script) or module:FUNC."""
    if factory is None or isinstance(factory, str):
        return factory
    mod = sys.modules.get(getattr(factory, "__module__", ""), None)
    name = getattr(factory, "__qualname__", getattr(factory, "__name__", None))
    if name is None or "<" in name:
        raise ObserveError(f"gradcert.watch(factory=...): {factory!r} has no importable name (a lambda or a "
                           f"nested function); pass a module-level function or 'FILE.py:FUNC'")
    path = getattr(mod, "__file__", None)
    # A module beside the script (importable in the job only because the script's folder is on
    # its sys.path) is named by its file; an installed package by its module name.
    installed = path and _importable_elsewhere(factory.__module__)
    if factory.__module__ == "__main__" or (path and not installed):
        if not path:
            raise ObserveError("gradcert.watch(factory=...): the factory's file is unknown; pass 'FILE.py:FUNC'")
        return f"{os.path.abspath(path)}:{name}"
    return f"{factory.__module__}:{name}"


def _importable_elsewhere(module: str) -> bool:
    """Whether `module` imports in another process (the reference runner's): some import finder
    finds it on sys.path without the script's own folder and the working directory, which only
    the job's sys.path holds (installed and editable packages are found; a script's sibling is not)."""
    job_only = {os.path.dirname(os.path.abspath(sys.argv[0]))} if sys.argv and sys.argv[0] else set()
    job_only |= {"", os.getcwd()}
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if p not in job_only and os.path.abspath(p) not in job_only]
    try:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            try:
                if find is not None and find(module.split(".")[0], None) is not None:
                    return True
            except (ImportError, ValueError, TypeError):
                continue
        return False
    finally:
        sys.path[:] = saved


# --------------------------------------------------------------------------------------
# Examples from a forward's inputs
# --------------------------------------------------------------------------------------


def shifted_targets(labels: torch.Tensor, convention: str) -> torch.Tensor:
    """gradcert's targets: position t predicts target[t]. "hf": the model shifts (labels[t+1]
    is position t's target, as HF causal LMs' loss does); "shifted": given as targets."""
    if convention == "shifted":
        return labels
    out = torch.full_like(labels, IGNORE)
    out[..., :-1] = labels[..., 1:]
    return out


def example_rows(input_ids: torch.Tensor, targets: torch.Tensor, attention_mask, position_ids):
    """[(tokens, targets)] per row, right padding cut where no target needs it. Left padding and
    packed rows (position ids that restart) are refused: the reference would see another input."""
    ids = input_ids.detach().to("cpu", torch.long)
    tg = targets.detach().to("cpu", torch.long)
    if ids.dim() != 2 or tg.shape != ids.shape:
        raise ObserveError(f"the forward's input_ids {list(ids.shape)} and labels {list(tg.shape)}: expected two "
                           f"[batch, length] tensors of one shape")
    T = ids.size(1)
    if position_ids is not None:
        pos = position_ids.detach().to("cpu", torch.long)
        expect = torch.arange(T).expand_as(ids)
        if pos.shape[-1] != T or not torch.equal(pos.expand_as(ids), expect):
            raise ObserveError("the forward was given position_ids that are not 0..T-1 in every row (packed "
                               "sequences or left padding): gradcert observe does not certify those yet")
    mask = attention_mask.detach().to("cpu") if attention_mask is not None else None
    rows = []
    for b in range(ids.size(0)):
        n = T
        if mask is not None:
            m = mask[b].reshape(-1)[:T] != 0
            n = int(m.sum())
            if n and not bool(m[:n].all()):
                raise ObserveError("a row's attention_mask is not a run of ones then zeros (left padding or "
                                   "packing): gradcert observe certifies right-padded rows")
        valid = (tg[b] != IGNORE).nonzero()
        if valid.numel():
            n = max(n if mask is not None else 0, int(valid[-1]) + 1)
        n = max(1, min(n, T))
        rows.append((ids[b, :n].tolist(), tg[b, :n].tolist()))
    return rows


def example_key(tokens, targets) -> str:
    """The example's identity: a digest of its tokens and targets (the job's sampler index is
    not visible to a forward hook; two equal examples are one identity)."""
    h = hashlib.blake2b(digest_size=10)
    h.update(torch.tensor(tokens, dtype=torch.int64).numpy().tobytes())
    h.update(b"|")
    h.update(torch.tensor(targets, dtype=torch.int64).numpy().tobytes())
    return "c" + h.hexdigest()


def turn_off_dropout(model: nn.Module, keep: bool) -> list:
    """Sets every dropout probability of the model to 0 (modules and the float attributes HF
    attention reads); returns what it changed. keep: refuse a model with active dropout."""
    changed = []
    for name, m in model.named_modules():
        where = name or "<root>"
        if isinstance(m, DROPOUT_TYPES) and m.p > 0:
            changed.append({"module": where, "type": type(m).__name__, "p": float(m.p)})
            if not keep:
                m.p = 0.0
        for attr in DROPOUT_ATTRS:
            v = m.__dict__.get(attr)
            if isinstance(v, float) and v > 0:
                changed.append({"module": where, "attribute": attr, "p": v})
                if not keep:
                    setattr(m, attr, 0.0)
    if keep and changed:
        raise ObserveError(f"--keep-dropout: the model has dropout ({_dropout_text(changed)}); gradcert cannot "
                           f"reproduce random dropout masks. Without --keep-dropout it turns them off for the "
                           f"observed updates and the report names them")
    return changed


def _dropout_text(changed) -> str:
    parts = [f"{c['module']}{'.' + c['attribute'] if 'attribute' in c else ''} p={c['p']:g}" for c in changed[:4]]
    return ", ".join(parts) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")


def hf_saved_config(model: nn.Module):
    """What rebuilds a Hugging Face PreTrainedModel (config with dropout off, class path), or a
    PEFT model over one (the base's, plus every adapter's config: "peft"); else None."""
    if _is_peft(model):
        base = model.get_base_model()
        saved = hf_saved_config(base)
        if saved is None:
            return None
        saved["peft"] = peft_facts(model)
        return saved
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "to_dict") or not hasattr(type(model), "_from_config"):
        return None
    d = cfg.to_dict()
    for k, v in list(d.items()):
        if isinstance(v, float) and v > 0 and ("dropout" in k or "pdrop" in k):
            d[k] = 0.0
    impl = getattr(cfg, "_attn_implementation", None)
    return {"class": qualified(model), "config": d, "attn_implementation": impl,
            "loss_type": getattr(model, "loss_type", None)}


def _is_peft(model) -> bool:
    return type(model).__module__.startswith("peft.") and hasattr(model, "peft_config") and \
        hasattr(model, "get_base_model")


def _jsonable(o):
    import enum

    if isinstance(o, enum.Enum):  # PeftType.LORA, TaskType.CAUSAL_LM
        return o.value
    if isinstance(o, (set, frozenset)):  # target_modules
        return sorted(_jsonable(x) for x in o)
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(x) for x in o]
    if o is None or isinstance(o, (bool, int, float, str)):
        return o
    raise ObserveError(f"gradcert.watch: the PEFT config holds {o!r}, which gradcert cannot save for the reference")


def peft_facts(model) -> dict:
    """A PeftModel's wrapper class, peft version and every adapter's config (dropout off)."""
    import peft

    adapters = {}
    for name, pc in model.peft_config.items():
        d = _jsonable(pc.to_dict())
        if isinstance(d.get("lora_dropout"), float) and d["lora_dropout"] > 0:
            d["lora_dropout"] = 0.0
        adapters[name] = d
    return {"wrapper": qualified(model), "version": peft.__version__, "adapters": adapters,
            "active_adapter": model.active_adapter}


OBSERVED_MODEL_PY = '''"""The observed job's model for gradcert's reference runner (written by gradcert.observe)."""
import os

from gradcert.hf import from_saved


def build(vocab_size, max_len):
    return from_saved(os.path.join(os.path.dirname(os.path.abspath(__file__)), "observed.model.json"))
'''


def _versions() -> dict:
    v = {"torch": torch.__version__, "python": sys.version.split()[0], "executable": sys.executable}
    for name in ("transformers", "accelerate", "lightning", "deepspeed", "peft"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__version__", None):
            v[name] = mod.__version__
    return v
