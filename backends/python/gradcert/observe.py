"""The recorder behind `gradcert.watch` and the framework callbacks (`gradcert observe`).

Under `gradcert observe -- CMD` (GRADCERT_OBSERVE_DIR set) each rank of the user's own job
records, per optimizer update (NOTE [observed records], conformance/protocol/observed.hpp
reads them):
  - at every training forward of the watched model (train mode, grad enabled): the inputs as
    the forward received them (`input_ids`, `labels` / `targets`, `attention_mask`,
    `position_ids`, `num_items_in_batch`), turned into gradcert's examples (tokens and
    *shifted* targets, trailing positions that no target needs cut off) keyed by a digest of
    their content, and gradcert's loss sum S of them on the job's own logits;
  - in the torch optimizer's step pre-hook: the gradient the optimizer is given, or, where
    the job clipped, the gradient as it was before `clip_grad_norm_` (which is wrapped), and
    every param group's hyperparameters as this step uses them (the schedule's lr included);
  - in the step post-hook: the parameters after the step (whole on rank 0, with a digest of
    every replica on every rank; or each rank's DTensor pieces under FSDP2).
Before the first step it writes the initial weights and (rank 0) `observed.json`: the model
(its class and config, or the factory the reference rebuilds it with), the dropout it turned
off, the label convention, the optimizer and the job's own batch settings. After
GRADCERT_OBSERVE_UPDATES updates every rank ends the job cleanly (exit 0).

Outside `gradcert observe` nothing here runs: `watch` returns a handle that does nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from .ref import client

ENV_DIR = "GRADCERT_OBSERVE_DIR"
ENV_UPDATES = "GRADCERT_OBSERVE_UPDATES"
ENV_KEEP_DROPOUT = "GRADCERT_OBSERVE_KEEP_DROPOUT"
IGNORE = -100
SCHEMA_RANK = "gradcert.observed-rank/1"
SCHEMA_JOB = "gradcert.observed/1"
DROPOUT_TYPES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
# Float attributes that HF attention code reads as its dropout probability (not modules).
DROPOUT_ATTRS = ("attention_dropout", "attn_dropout", "dropout", "dropout_p", "dropout_prob", "attn_pdrop")
SUPPORTED_OPTIMIZERS = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw"}


class ObserveError(RuntimeError):
    """Something the integration cannot record; the job is ended with this message."""


def observing() -> bool:
    """Whether this process runs under `gradcert observe`."""
    return bool(os.environ.get(ENV_DIR))


class NoOp:
    """What `watch` returns outside `gradcert observe`: every method does nothing."""

    active = False

    def __bool__(self):
        return False

    def set_job(self, **_):
        return self

    def close(self):
        pass


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
        if isinstance(optimizer, torch.optim.Optimizer):
            return optimizer
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None:
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
    return f"{t.__module__}.{t.__qualname__}"


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
    if factory.__module__ == "__main__" or (path and not _importable(factory.__module__)):
        if not path:
            raise ObserveError("gradcert.watch(factory=...): the factory's file is unknown; pass 'FILE.py:FUNC'")
        return f"{os.path.abspath(path)}:{name}"
    return f"{factory.__module__}:{name}"


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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
    """(config dict with dropout off, class path) of a Hugging Face PreTrainedModel, else None."""
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


OBSERVED_MODEL_PY = '''"""The observed job's model for gradcert's reference runner (written by gradcert.observe)."""
import os

from gradcert.hf import from_saved


def build(vocab_size, max_len):
    return from_saved(os.path.join(os.path.dirname(os.path.abspath(__file__)), "observed.model.json"))
'''


# --------------------------------------------------------------------------------------
# The recorder
# --------------------------------------------------------------------------------------


class Observer:
    """One rank's recorder of a job under `gradcert observe` (see the module docstring)."""

    active = True

    def __init__(self, model: nn.Module, optimizer, *, factory=None, labels: str | None = None,
                 integration: str = "watch", job: dict | None = None):
        self.out = os.environ[ENV_DIR]
        self.updates_asked = int(os.environ.get(ENV_UPDATES, "3") or 3)
        self.nonce = client.run_nonce()
        import torch.distributed as dist

        self.dist = dist if dist.is_available() and dist.is_initialized() else None
        self.rank = self.dist.get_rank() if self.dist else int(os.environ.get("RANK", "0"))
        self.world = self.dist.get_world_size() if self.dist else int(os.environ.get("WORLD_SIZE", "1"))
        self.integration = integration
        if labels not in (None, "hf", "shifted"):
            raise ObserveError(f"gradcert.watch(labels={labels!r}): expected 'hf' (the model shifts, as Hugging Face "
                               f"causal LMs) or 'shifted' (labels[t] is position t's target)")
        self.labels = labels
        self.wrapped = model
        self.model = unwrap_model(model)
        self.optimizer = unwrap_optimizer(optimizer)
        self.names = {}
        for n, p in self.model.named_parameters():
            self.names[id(p)] = n
        self.params = dict(self.model.named_parameters())
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in self.names:
                    raise ObserveError(f"gradcert.watch: the optimizer steps a tensor of shape {list(p.shape)} that "
                                       f"is not a parameter of the watched model ({qualified(self.model)})")
        self.sharded = any(_is_dtensor(p) for p in self.params.values())
        self.dtype = self._dtype()
        self.dropout = turn_off_dropout(self.model, os.environ.get(ENV_KEEP_DROPOUT) == "1")
        self.factory = factory_string(factory)
        self.hf = hf_saved_config(self.model)
        self.job = dict(job or {})
        self.update = 0
        self.micro: list = []
        self.S = 0.0
        self.vocab = None
        self.max_len = 0
        self.seen_n_items = []
        self.clip = None
        self._pre_clip = None
        self._grads = None
        self._groups = None
        self._excluded = 0.0
        self._t0 = time.perf_counter()
        self._handles = []
        self._autocast = set()
        self._ended = False
        t = time.perf_counter()
        self._write_initial()
        self._write_job(status="watching")
        self._handles.append(self.model.register_forward_pre_hook(self._pre_forward, with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._post_forward, with_kwargs=True))
        self._handles.append(self.optimizer.register_step_pre_hook(self._pre_step))
        self._handles.append(self.optimizer.register_step_post_hook(self._post_step))
        _install_clip_wrapper()
        _OBSERVERS.append(self)
        self._excluded += time.perf_counter() - t

    def __bool__(self):
        return True

    def set_job(self, **facts):
        """The job's own batch settings where an integration can read them (e.g. HF's
        per_device_train_batch_size, gradient_accumulation_steps): `expect_batch`, `micro`,
        `accum`, `max_grad_norm`, `source`."""
        self.job.update({k: v for k, v in facts.items() if v is not None})
        self._write_job(status="watching")
        return self

    # --- facts --------------------------------------------------------------------------
    def _dtype(self) -> str:
        kinds = {p.dtype for p in self.params.values() if p.requires_grad}
        names = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16"}
        if len(kinds) != 1 or next(iter(kinds)) not in names:
            raise ObserveError(f"gradcert.watch: the trainable parameters are {sorted(str(k) for k in kinds)}; gradcert "
                               f"observe certifies one dtype of float64, float32 or bfloat16")
        return names[next(iter(kinds))]

    def _full(self, t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if _is_dtensor(t) else t

    def _write_initial(self):
        # Every rank takes part in a DTensor gather; rank 0 writes.
        init = {n: self._full(p.detach()).to("cpu").clone() for n, p in self.params.items()}
        if self.rank == 0:
            client.write_tensors(os.path.join(self.out, "initial.safetensors"), init,
                                 client.DTYPES[self.dtype], metadata={"schema": "gradcert.initial/1"})

    def _job_record(self, status: str) -> dict:
        model = {"class": qualified(self.model), "factory": self.factory, "dtype": self.dtype,
                 "vocab": self.vocab, "max_len": self.max_len,
                 "frozen": [n for n, p in self.params.items() if not p.requires_grad],
                 "parameters": len(self.params)}
        if self.hf is not None:
            model["hf"] = {k: v for k, v in self.hf.items() if k != "config"}
        opt = type(self.optimizer)
        defaults = {k: v for k, v in self.optimizer.defaults.items() if isinstance(v, (int, float, bool, str, tuple))}
        return {"schema": SCHEMA_JOB, "nonce": self.nonce, "world": self.world, "integration": self.integration,
                "status": status, "updates_asked": self.updates_asked, "updates_done": self.update,
                "model": model, "labels": self.labels, "dropout_turned_off": self.dropout,
                "optimizer": {"class": qualified(opt), "kind": SUPPORTED_OPTIMIZERS.get(opt.__name__),
                              "defaults": {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}},
                "sharded": self.sharded, "autocast": sorted(self._autocast), "job": self.job,
                "versions": _versions()}

    def _write_job(self, status: str):
        if self.rank != 0:
            return
        if self.hf is not None and not os.path.exists(os.path.join(self.out, "observed.model.json")):
            client.write_json(os.path.join(self.out, "observed.model.json"), self.hf)
            with open(os.path.join(self.out, "observed_model.py"), "w") as f:
                f.write(OBSERVED_MODEL_PY)
        client.write_json(os.path.join(self.out, "observed.json"), self._job_record(status))

    # --- hooks --------------------------------------------------------------------------
    def _pre_forward(self, module, args, kwargs):
        if not module.training or not torch.is_grad_enabled() or self._ended:
            return None
        t = time.perf_counter()
        ids = kwargs.get("input_ids", args[0] if args else None)
        labels, convention = kwargs.get("labels"), self.labels or "hf"
        if labels is None and "targets" in kwargs:
            labels, convention = kwargs["targets"], self.labels or "shifted"
        if labels is None and len(args) > 1 and torch.is_tensor(args[1]):
            labels, convention = args[1], self.labels or "shifted"
        if not torch.is_tensor(ids) or not torch.is_tensor(labels):
            self.fail(f"a training forward of {qualified(module)} got no input_ids and labels tensors (got "
                      f"{sorted(kwargs) or 'positional arguments only'}): pass labels to the model's forward "
                      f"(labels=..., shifted inside as HF does; or targets=... / a second argument, already "
                      f"shifted), or tell gradcert.watch(labels='hf' | 'shifted')")
        targets = shifted_targets(labels, convention)
        self.labels = convention
        rows = example_rows(ids, targets, kwargs.get("attention_mask"), kwargs.get("position_ids"))
        n_items = kwargs.get("num_items_in_batch")
        if torch.is_tensor(n_items):
            n_items = int(n_items.detach().to("cpu").reshape(-1)[0])
        elif isinstance(n_items, (int, float)):
            n_items = int(round(n_items))
        self._pending = (rows, targets)
        self.micro.append({"examples": [{"key": example_key(tk, tg), "tokens": tk, "labels": tg} for tk, tg in rows],
                           "num_items_in_batch": n_items})
        self.max_len = max(self.max_len, int(ids.size(1)))
        for dev in ("cpu", "cuda"):
            try:
                if torch.is_autocast_enabled(dev):
                    self._autocast.add(f"{dev}:{str(torch.get_autocast_dtype(dev)).replace('torch.', '')}")
            except (TypeError, RuntimeError, AttributeError):
                pass
        self._excluded += time.perf_counter() - t
        return None

    def _post_forward(self, module, args, kwargs, output):
        pending = getattr(self, "_pending", None)
        if pending is None:
            return None
        t = time.perf_counter()
        self._pending = None
        logits = output.logits if hasattr(output, "logits") else output["logits"] if isinstance(output, dict) \
            else output[1] if isinstance(output, tuple) and len(output) > 1 and torch.is_tensor(output[1]) \
            and output[1].dim() == 3 else output
        if not torch.is_tensor(logits) or logits.dim() != 3:
            self.fail(f"the forward of {qualified(module)} returned {type(output).__name__}; expected logits "
                      f"[batch, length, vocab] (a tensor, .logits, a dict's 'logits', or (loss, logits))")
        self.vocab = int(logits.size(-1))
        with torch.no_grad():
            lg = _local(logits.detach())
            lg = lg.float() if lg.dtype in (torch.bfloat16, torch.float16) else lg
            tg = pending[1].to(lg.device)
            self.S += float(F.cross_entropy(lg.reshape(-1, lg.size(-1)), tg.reshape(-1), ignore_index=IGNORE,
                                            reduction="sum").double())
        self._excluded += time.perf_counter() - t
        return None

    def saw_clip(self, parameters, max_norm, total_norm):
        """From the wrapped clip_grad_norm_: the gradient before clipping (first call of a window)."""
        if self._ended:
            return
        if self._pre_clip is None:
            self._pre_clip = self._read_grads()
        self.clip = {"max_norm": float(max_norm),
                     "total_norm": float(total_norm) if total_norm is not None else None}

    def owns_any(self, parameters) -> bool:
        return any(id(p) in self.names for p in parameters)

    def _read_grads(self) -> dict:
        out = {}
        for n, p in self.params.items():
            g = p.grad
            out[n] = (g.detach().clone() if g is not None else torch.zeros_like(p.detach()))
        return out

    def _pre_step(self, optimizer, args, kwargs):
        if self._ended:
            return
        t = time.perf_counter()
        self._grads = self._pre_clip if self._pre_clip is not None else self._read_grads()
        self._pre_clip = None
        groups = []
        for g in optimizer.param_groups:
            h = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()
                 if k != "params" and isinstance(v, (int, float, bool, str, tuple, type(None)))}
            h = {k: (float(v.item()) if torch.is_tensor(v) else v) for k, v in h.items()}
            if torch.is_tensor(g.get("lr")):
                h["lr"] = float(g["lr"].item())
            h["params"] = [self.names[id(p)] for p in g["params"]]
            groups.append(h)
        self._groups = groups
        self._excluded += time.perf_counter() - t

    def _post_step(self, optimizer, args, kwargs):
        if self._ended:
            return
        t = time.perf_counter()
        if self._grads is None:
            self.fail("the optimizer stepped without its step pre-hook having run (a fused or compiled step?)")
        if not self.micro:
            self.fail(f"update {self.update}: the optimizer stepped without a training forward of the watched "
                      f"model since the last step (is {qualified(self.model)} the model the job trains?)")
        u = self.update
        step_seconds = max(0.0, t - self._t0 - self._excluded)
        params = {n: p.detach() for n, p in self.params.items()}
        dtype = client.DTYPES[self.dtype]
        if self.sharded:
            files = {}
            for kind, tensors in (("grads", self._grads), ("params", params)):
                stored, placement = client.shard_pieces(tensors, dtype, self.rank)
                path = os.path.join(self.out, f"u{u}.rank{self.rank}.{kind}.safetensors")
                client.write_tensors(path, stored, dtype, u, metadata={"gradcert.placement": json.dumps(placement)})
                files[kind] = [f"u{u}.rank{r}.{kind}.safetensors" for r in range(self.world)]
        else:
            files = {"grads": f"u{u}.grads.safetensors", "params": f"u{u}.params.safetensors"}
            if self.rank == 0:
                client.write_tensors(os.path.join(self.out, files["grads"]), self._grads, dtype, u)
                client.write_tensors(os.path.join(self.out, files["params"]), params, dtype, u)
        rec = {"schema": SCHEMA_RANK, "rank": self.rank, "world": self.world, "nonce": self.nonce, "update": u,
               "microsteps": self.micro, "loss_sum": self.S, "step_seconds": step_seconds, "clip": self.clip,
               "grads": files["grads"], "params": files["params"]}
        if not self.sharded and self.world > 1:
            rec["replicas"] = client.replica_digests(params.items())
        if self.rank == 0:
            rec["groups"] = self._groups
        client.write_json(os.path.join(self.out, f"observed.rank{self.rank}.u{u}.json"), rec)
        self.update += 1
        self.micro, self.S, self.clip, self._grads, self._groups = [], 0.0, None, None, None
        if self.update >= self.updates_asked:
            self.end(f"gradcert ended the job after {self.update} updates (--updates {self.updates_asked})")
        self._excluded = 0.0
        self._t0 = time.perf_counter()

    # --- the end ------------------------------------------------------------------------
    def end(self, why: str, code: int = 0):
        """Writes the job record and ends this rank (every rank reaches it after the same update)."""
        self._ended = True
        self._write_job(status=why)
        if self.dist is not None and code == 0:
            try:
                self.dist.barrier()
            except Exception:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def fail(self, msg: str):
        text = f"gradcert observe: rank {self.rank}, update {self.update}: {msg}"
        print(text, file=sys.stderr, flush=True)
        try:
            client.write_json(os.path.join(self.out, f"observed.rank{self.rank}.error.json"),
                              {"schema": "gradcert.observed-error/1", "rank": self.rank, "update": self.update,
                               "nonce": self.nonce, "error": msg})
        except OSError:
            pass
        self.end(msg, code=3)

    def close(self):
        for h in self._handles:
            h.remove()
        self._handles = []


def _versions() -> dict:
    v = {"torch": torch.__version__, "python": sys.version.split()[0], "executable": sys.executable}
    for name in ("transformers", "accelerate", "lightning", "deepspeed", "peft"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__version__", None):
            v[name] = mod.__version__
    return v


# --------------------------------------------------------------------------------------
# clip_grad_norm_: the gradient before clipping
# --------------------------------------------------------------------------------------

_OBSERVERS: list = []
_ORIGINAL_CLIP = None


def _install_clip_wrapper():
    """Wraps torch.nn.utils.clip_grad_norm_ (both names a framework calls it by) so that the
    recorded gradient is the one before clipping; the max norm is recorded too. A job that
    imported the function itself before watch() (`from torch.nn.utils import clip_grad_norm_`)
    calls the original: its gradient is then recorded after clipping (observed.json says
    whether a clip was seen)."""
    global _ORIGINAL_CLIP
    if _ORIGINAL_CLIP is not None:
        return
    import torch.nn.utils as U
    import torch.nn.utils.clip_grad as C

    original = U.clip_grad_norm_
    _ORIGINAL_CLIP = original

    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        params = [parameters] if torch.is_tensor(parameters) else list(parameters)
        owners = [o for o in _OBSERVERS if o.owns_any(params)]
        for o in owners:
            if o._pre_clip is None and not o._ended:
                o._pre_clip = o._read_grads()
        total = original(params, max_norm, *args, **kwargs)
        for o in owners:
            o.saw_clip(params, max_norm, _local(total).item() if torch.is_tensor(total) else total)
        return total

    clip_grad_norm_.__wrapped__ = original
    clip_grad_norm_.__doc__ = original.__doc__
    U.clip_grad_norm_ = clip_grad_norm_
    C.clip_grad_norm_ = clip_grad_norm_


def watch(model: nn.Module, optimizer, *, factory=None, labels: str | None = None, integration: str = "watch",
          job: dict | None = None):
    """Records the job for `gradcert observe`; a no-op handle outside it (leave it in).

    model: the job's model as it trains it (DDP / FSDP / DeepSpeed engine / compiled: unwrapped
      here); its forward must receive `input_ids` and `labels` (or `targets`).
    optimizer: the optimizer the job steps (accelerate's, Lightning's and DeepSpeed's wrappers
      are unwrapped to the torch.optim.Optimizer inside).
    factory: how gradcert's reference rebuilds the model, for a model that is not a Hugging Face
      PreTrainedModel: a module-level function or 'FILE.py:FUNC', FUNC(vocab_size, max_len).
    labels: 'hf' (labels as HF causal LMs take them, shifted by the model) or 'shifted'
      (labels[t] is position t's target); default: 'hf' for a `labels=` keyword, 'shifted' for
      `targets=` or a second positional argument.
    """
    if not observing():
        return NoOp()
    try:
        return Observer(model, optimizer, factory=factory, labels=labels, integration=integration, job=job)
    except ObserveError as e:
        _fail_early(str(e))


def _fail_early(msg: str):
    rank = int(os.environ.get("RANK", "0"))
    print(f"gradcert observe: rank {rank}: {msg}", file=sys.stderr, flush=True)
    try:
        client.write_json(os.path.join(os.environ[ENV_DIR], f"observed.rank{rank}.error.json"),
                          {"schema": "gradcert.observed-error/1", "rank": rank, "update": 0,
                           "nonce": client.run_nonce(), "error": msg})
    except OSError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(3)
