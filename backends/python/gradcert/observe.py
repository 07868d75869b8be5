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

The helpers that read the job's objects and inputs (unwrapping, examples and their keys,
dropout, a Hugging Face model's config) are in gradcert._observe_facts; every name is also
importable from here.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._observe_facts import (  # noqa: F401  (re-exported: gradcert.observe.NAME as before)
    DROPOUT_ATTRS, DROPOUT_TYPES, IGNORE, OBSERVED_MODEL_PY, ObserveError, _dropout_text, _is_dtensor, loader_facts, model_max_len,
    _local, _versions, example_key, example_rows, factory_string, hf_saved_config, qualified, shifted_targets,
    turn_off_dropout, unwrap_model, unwrap_optimizer)
from . import _deepspeed, _fsdp1, _job_module, _loss_targets
from ._observe_hooks import (  # noqa: F401  (install_loss_wrapper: gradcert/__init__ installs it at import)
    ORIGINAL_LOSSES, OBSERVERS, install_clip_wrapper, install_excepthook, install_loss_wrapper)
from ._observe_facts import _importable_elsewhere
from .ref import client

from . import ENV_DIR, observing  # noqa: E402,F401  (gradcert/_env.py, the one list)
from ._env import DEVICE as ENV_DEVICE  # noqa: E402
from ._env import OBSERVE_KEEP_DROPOUT as ENV_KEEP_DROPOUT  # noqa: E402
from ._env import OBSERVE_UPDATES as ENV_UPDATES  # noqa: E402
SCHEMA_RANK = "gradcert.observed-rank/1"
SCHEMA_JOB = "gradcert.observed/1"
SUPPORTED_OPTIMIZERS = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw"}


class NoOp:
    """What `watch` returns outside `gradcert observe`: every method does nothing."""

    active = False

    def __bool__(self):
        return False

    def set_job(self, **_):
        return self

    def capture_grads(self):
        pass

    def close(self):
        pass


# --------------------------------------------------------------------------------------
# The recorder
# --------------------------------------------------------------------------------------


class Observer:
    """One rank's recorder of a job under `gradcert observe` (see the module docstring)."""

    active = True

    def __init__(self, model: nn.Module, optimizer, *, factory=None, labels: str | None = None,
                 integration: str = "watch", job: dict | None = None, max_len: int | None = None):
        self.out = os.environ[ENV_DIR]
        self.updates_asked = int(os.environ.get(ENV_UPDATES, "3") or 3)
        self.nonce = client.run_nonce()
        import torch.distributed as dist

        self.dist = dist if dist.is_available() and dist.is_initialized() else None
        self.rank = self.dist.get_rank() if self.dist else int(os.environ.get("RANK", "0"))
        self.world = self.dist.get_world_size() if self.dist else int(os.environ.get("WORLD_SIZE", "1"))
        self.integration = integration
        if labels not in (None, "hf", "shifted", "loss-call"):
            raise ObserveError(f"gradcert.watch(labels={labels!r}): expected 'hf' (the model shifts, as Hugging Face "
                               f"causal LMs), 'shifted' (labels[t] is position t's target) or 'loss-call' (the "
                               f"targets of the job's own F.cross_entropy call on the logits)")
        self.labels = labels
        self.wrapped = model
        self.model = unwrap_model(model)
        self.optimizer = unwrap_optimizer(optimizer)
        self.fsdp1 = _fsdp1.fsdp1_root(model)  # NOTE [FSDP1 shards]
        self.engine = _deepspeed.engine_of(model, optimizer)  # NOTE [DeepSpeed engine]
        self.names, self.params = self._tensors()
        for g in self.optimizer.param_groups if self.engine is None else []:  # the engine steps flat partitions
            for p in g["params"]:
                if id(p) not in self.names:
                    raise ObserveError(f"gradcert.watch: the optimizer steps a tensor of shape {list(p.shape)} that "
                                       f"is not a parameter of the watched model ({qualified(self.model)})")
        self.sharded = any(_is_dtensor(p) for p in self.params.values())
        self.dtype = self._dtype()
        # `gradcert observe --device D` (NOTE [device], conformance/launch/cuda_probe.cpp) holds
        # the job to D; the records are copied to the CPU, where the reference runs.
        want, where = os.environ.get(ENV_DEVICE, ""), {p.device.type for p in self.params.values()}
        if want and where != {want}:
            raise ObserveError(f"gradcert observe --device {want}: rank {os.environ.get('RANK', '0')}'s model "
                               f"parameters are on {', '.join(sorted(where))}: move the model there before watch(), "
                               f"or run gradcert observe --device {next(iter(where)) if len(where) == 1 else 'cpu'}")
        self.dropout = turn_off_dropout(self.model, os.environ.get(ENV_KEEP_DROPOUT) == "1")
        self.factory = factory_string(factory)
        self.hf = hf_saved_config(self.model)
        self.job = dict(job or {})
        self.update = 0
        self.micro: list = []
        self.S = 0.0
        self.vocab = None
        self.max_len = int(max_len) if max_len else model_max_len(self.model)
        self.seen_n_items = []
        self.clip = None
        self._pre_clip = None
        self._forwards_at_pre_step = 0
        self._grads = None
        self._groups = None
        self._excluded = 0.0
        self._t0 = time.perf_counter()
        self._handles = []
        self._autocast = set()
        self._waiting = []  # forwards without labels, waiting for the job's loss call
        self._loss_calls_unmatched = []
        self._ended = False
        t = time.perf_counter()
        initial = self._write_initial()
        self._rebuild = self._save_model(initial)
        self._write_job(status="watching")
        self._handles.append(self.model.register_forward_pre_hook(self._pre_forward, with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._post_forward, with_kwargs=True))
        if self.engine is not None:
            self._unwrap_step = _deepspeed.wrap_step(self.engine, self)
        else:
            self._handles.append(self.optimizer.register_step_pre_hook(self._pre_step))
            self._handles.append(self.optimizer.register_step_post_hook(self._post_step))
        install_clip_wrapper()
        install_loss_wrapper()
        install_excepthook()
        OBSERVERS.append(self)
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
    def _tensors(self):
        """(id of each tensor the optimizer may hold -> the parameter names it holds, name -> the
        parameter): the model's own, or under FSDP1 full copies gathered from every rank's shards
        (its optimizer holds 1-D views or FlatParameters)."""
        if self.fsdp1 is None:
            named = dict(self.model.named_parameters())
            return {id(p): [n] for n, p in named.items()}, named
        from torch.distributed.fsdp._common_utils import clean_tensor_name

        names = {id(fp): ns for fp, ns in _fsdp1.fsdp1_flat_param_names(self.fsdp1).items()}
        for n, p in self.fsdp1.named_parameters():
            names.setdefault(id(p), [clean_tensor_name(n)])
        trains = {n: p.requires_grad for p in self.fsdp1.parameters() for n in names.get(id(p), [])}
        full = _fsdp1.fsdp1_full_tensors(self.fsdp1, "param")
        return names, {n: t.requires_grad_(trains.get(n, True)) for n, t in full.items()}

    def _dtype(self) -> str:
        kinds = {p.dtype for p in self.params.values() if p.requires_grad}
        names = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16"}
        if len(kinds) != 1 or next(iter(kinds)) not in names:
            raise ObserveError(f"gradcert.watch: the trainable parameters are {sorted(str(k) for k in kinds)}; gradcert "
                               f"observe certifies one dtype of float64, float32 or bfloat16")
        return names[next(iter(kinds))]

    def _full(self, t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if _is_dtensor(t) else t

    def _write_initial(self) -> dict:
        # Every rank takes part in the gathers (DTensor, FSDP1, ZeRO-3); rank 0 writes.
        init = {n: self._full(p.detach()).to("cpu").clone() for n, p in self._current_params().items()}
        if self.rank == 0:
            client.write_tensors(os.path.join(self.out, "initial.safetensors"), init,
                                 client.DTYPES[self.dtype], metadata={"schema": "gradcert.initial/1"})
        return init

    def _job_record(self, status: str) -> dict:
        model = {"class": qualified(self.model), "factory": self.factory, "dtype": self.dtype,
                 "vocab": self.vocab, "max_len": self.max_len,
                 "frozen": [n for n, p in self.params.items() if not p.requires_grad],
                 "parameters": len(self.params)}
        if self.hf is not None:
            model["hf"] = {k: v for k, v in self.hf.items() if k != "config"}
        if self.rank == 0:
            model["rebuild"] = self._rebuild
        opt = type(self.optimizer)
        defaults = {k: v for k, v in self.optimizer.defaults.items() if isinstance(v, (int, float, bool, str, tuple))}
        return {"schema": SCHEMA_JOB, "nonce": self.nonce, "world": self.world, "integration": self.integration,
                "status": status, "updates_asked": self.updates_asked, "updates_done": self.update,
                "model": model, "labels": self.labels, "dropout_turned_off": self.dropout,
                "optimizer": {"class": qualified(opt), "kind": SUPPORTED_OPTIMIZERS.get(opt.__name__),
                              "defaults": {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}},
                "sharded": self.sharded, "autocast": sorted(self._autocast), "job": self.job,
                "versions": _versions()}

    def _save_model(self, initial: dict) -> dict:
        """Rank 0: what the reference rebuilds the model from where no factory is given: the HF
        config, else the job's own module (NOTE [the job's own module]). {"how": ...} or {"error": ...}."""
        if self.rank != 0 or self.factory is not None:
            return {}
        if self.hf is not None:
            client.write_json(os.path.join(self.out, "observed.model.json"), self.hf)
            script, how = OBSERVED_MODEL_PY, f"its saved Hugging Face config ({self.hf['class']})"
            if self.hf.get("peft"):
                how += f" with the job's PEFT adapters ({self.hf['peft']['wrapper']}, peft {self.hf['peft']['version']})"
        else:
            try:
                full = {n: t.requires_grad_(self.params[n].requires_grad) for n, t in initial.items()}
                how = _job_module.save(self.model, self.out, full, _importable_elsewhere)
            except Exception as e:  # whatever the job's module holds that will not pickle
                return {"error": f"{type(e).__name__}: {e}"}
            script = _job_module.OBSERVED_MODULE_PY
        with open(os.path.join(self.out, "observed_model.py"), "w") as f:
            f.write(script)
        return {"how": how}


    def _write_job(self, status: str):
        if self.rank != 0:
            return
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
        if not torch.is_tensor(ids):
            self.fail(f"a training forward of {qualified(module)} got no input_ids tensor (got "
                      f"{sorted(kwargs) or 'positional arguments only'}): gradcert observe certifies token models "
                      f"whose forward takes input_ids first (or as input_ids=...)")
        n_items = kwargs.get("num_items_in_batch")
        if torch.is_tensor(n_items):
            n_items = int(n_items.detach().to("cpu").reshape(-1)[0])
        elif isinstance(n_items, (int, float)):
            n_items = int(round(n_items))
        if not torch.is_tensor(labels) or convention == "loss-call":
            # The job's own loss call will say which positions are targets (NOTE [loss outside the model]).
            w = _loss_targets.Waiting(ids.detach(), kwargs.get("attention_mask"), kwargs.get("position_ids"), n_items)
            self._pending = w
            self.micro.append(w)
        else:
            targets = shifted_targets(labels, convention)
            self.labels = convention
            rows = example_rows(ids, targets, kwargs.get("attention_mask"), kwargs.get("position_ids"))
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
        if isinstance(pending, _loss_targets.Waiting):
            pending.logits = _local(logits.detach())
            self._waiting.append(pending)
        else:
            self.S += self._loss_sum(logits, pending[1])
        self._excluded += time.perf_counter() - t
        return None

    @staticmethod
    def _loss_sum(logits, targets) -> float:
        """gradcert's loss sum S of the forward's logits at these targets (shifted, IGNORE elsewhere)."""
        with torch.no_grad():
            lg = _local(logits.detach())
            lg = lg.float() if lg.dtype in (torch.bfloat16, torch.float16) else lg
            tg = targets.to(lg.device)
            cross_entropy = ORIGINAL_LOSSES.get("cross_entropy", F.cross_entropy)  # not the job's (wrapped) one
            return float(cross_entropy(lg.reshape(-1, lg.size(-1)), tg.reshape(-1), ignore_index=IGNORE,
                                       reduction="sum").double())

    def saw_loss(self, kind: str, inp, target, options: dict):
        """From the wrapped F.cross_entropy / F.nll_loss while a forward waits for its targets."""
        if self._ended or not self._waiting:
            return
        t = time.perf_counter()
        call = _loss_targets.call_text(kind, options)
        try:
            w = _loss_targets.assign(self._waiting, inp, target, ignore_index=int(options.get("ignore_index", IGNORE)),
                                     kind=kind, call=call)
        except LookupError as e:
            self.fail(f"the job's loss call {e}")
        if w is None:
            self._loss_calls_unmatched.append(call)
        else:
            refused = _loss_targets.refuse_options(kind, options)
            if refused:
                self.fail(refused)
        self._excluded += time.perf_counter() - t

    def _resolve_waiting(self):
        """The forwards whose targets came from the job's loss calls, as gradcert's examples."""
        for i, w in enumerate(self.micro):
            if not isinstance(w, _loss_targets.Waiting):
                continue
            if w.logits is None or not w.resolved():
                seen = sorted(set(self._loss_calls_unmatched))
                self.fail(f"a training forward of {qualified(self.model)} got no labels, and no loss call on its logits "
                          f"was seen before the optimizer step (loss calls on other tensors: {', '.join(seen) or 'none'}). "
                          f"gradcert learns the targets from torch.nn.functional.cross_entropy / nll_loss (or "
                          f"nn.CrossEntropyLoss / nn.NLLLoss) called on the model's logits (sliced, reshaped or upcast); "
                          f"a job that computes its loss another way passes labels= to the model's forward, or "
                          f"imports gradcert before it imports cross_entropy by name")
            B, T = w.logits.size(0), w.logits.size(1)
            targets = w.targets.view(B, T)
            rows = example_rows(w.ids, targets, w.attention_mask, w.position_ids)
            self.S += self._loss_sum(w.logits, targets)
            self.micro[i] = {"examples": [{"key": example_key(tk, tg), "tokens": tk, "labels": tg} for tk, tg in rows],
                             "num_items_in_batch": w.n_items, "loss_calls": w.calls}
            self.labels = "loss-call"
        self._waiting, self._loss_calls_unmatched = [], []

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

    def _current_params(self) -> dict:
        """The parameters as they stand (a collective under FSDP1: every rank is here)."""
        if self.fsdp1 is not None:
            return _fsdp1.fsdp1_full_tensors(self.fsdp1, "param")
        if self.engine is not None:
            return _deepspeed.full_params(self.engine, self.params)
        return {n: p.detach() for n, p in self.params.items()}

    def _read_grads(self) -> dict:
        if self.engine is not None:
            return _deepspeed.full_grads(self.engine, self.params)
        if self.fsdp1 is not None:
            grads = _fsdp1.fsdp1_full_tensors(self.fsdp1, "grad")
            return {n: grads.get(n) if grads.get(n) is not None else torch.zeros_like(p) for n, p in self.params.items()}
        out = {}
        for n, p in self.params.items():
            g = p.grad
            out[n] = (g.detach().clone() if g is not None else torch.zeros_like(p.detach()))
        return out

    def capture_grads(self):
        """The gradient the optimizer is about to step with, before any clipping: for loops that
        run the window's backward inside `optimizer.step(closure)` (Lightning), whose step
        pre-hook fires before the closure. The first capture after a step counts."""
        if not self._ended and self._pre_clip is None:
            self._pre_clip = self._read_grads()

    def _pre_step(self, optimizer, args, kwargs):
        if self._ended:
            return
        t = time.perf_counter()
        self._grads = self._pre_clip if self._pre_clip is not None else self._read_grads()
        self._forwards_at_pre_step = len(self.micro)
        groups = []
        in_group = _deepspeed.group_names(self.engine, optimizer, self.names) if self.engine is not None else None
        for i, g in enumerate(optimizer.param_groups):
            h = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()
                 if k != "params" and isinstance(v, (int, float, bool, str, tuple, type(None)))}
            h = {k: (float(v.item()) if torch.is_tensor(v) else v) for k, v in h.items()}
            if torch.is_tensor(g.get("lr")):
                h["lr"] = float(g["lr"].item())
            h["params"] = in_group[i] if in_group is not None else [n for p in g["params"] for n in self.names[id(p)]]
            groups.append(h)
        self._groups = groups
        self._excluded += time.perf_counter() - t

    def _post_step(self, optimizer, args, kwargs):
        if self._ended:
            return
        t = time.perf_counter()
        if self._grads is None:
            self.fail("the optimizer stepped without its step pre-hook having run (a fused or compiled step?)")
        if self._pre_clip is not None:  # captured after the pre-hook: inside a closure (Lightning)
            self._grads = self._pre_clip
        elif len(self.micro) != self._forwards_at_pre_step:
            self.fail("the optimizer ran forwards inside step(closure) after its step pre-hook, so the gradient it "
                      "stepped with was not seen: call the observer's capture_grads() after the closure's backward "
                      "(gradcert.lightning.Callback does this for Lightning)")
        self._pre_clip = None
        self._resolve_waiting()
        if not self.micro:
            self.fail(f"update {self.update}: the optimizer stepped without a training forward of the watched "
                      f"model since the last step (is {qualified(self.model)} the model the job trains?)")
        u = self.update
        step_seconds = max(0.0, t - self._t0 - self._excluded)
        params = self._current_params()
        dtype = client.DTYPES[self.dtype]
        if self.sharded:
            files = {}
            for kind, tensors in (("grads", self._grads), ("params", params)):
                stored, placement = client.shard_pieces(tensors, dtype, self.rank)
                path = os.path.join(self.out, f"u{u}.rank{self.rank}.{kind}.safetensors")
                client.write_tensors(path, stored, dtype, u, metadata={"gradcert.placement": json.dumps(placement)})
                files[kind] = [os.path.basename(path)]  # this rank's pieces; gradcert lists every rank's
        else:
            files = {"grads": f"u{u}.grads.safetensors", "params": f"u{u}.params.safetensors"}
            if self.rank == 0:
                client.write_tensors(os.path.join(self.out, files["grads"]), self._grads, dtype, u)
                client.write_tensors(os.path.join(self.out, files["params"]), params, dtype, u)
        rec = {"schema": SCHEMA_RANK, "rank": self.rank, "world": self.world, "nonce": self.nonce, "update": u,
               "microsteps": self.micro, "loss_sum": client.measured(self.S), "step_seconds": step_seconds, "clip": self.clip,
               "grads": files["grads"], "params": files["params"]}
        if not self.sharded and self.fsdp1 is None and self.engine is None and self.world > 1:
            rec["replicas"] = client.replica_digests(params.items())
        if self.rank == 0:
            rec["groups"] = self._groups
        # What recording this update cost this rank (hooks, copies, files): the job's own step
        # time above excludes it (observing cost = (step + record) / step).
        rec["record_seconds"] = self._excluded + (time.perf_counter() - t)
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
        if getattr(self, "_unwrap_step", None):
            self._unwrap_step()


def watch(model: nn.Module, optimizer, *, factory=None, labels: str | None = None, integration: str = "watch",
          job: dict | None = None, max_len: int | None = None, loader=None, accum: int | None = None):
    """Records the job for `gradcert observe`; a no-op handle outside it (leave it in).

    model: the job's model as it trains it (DDP / FSDP / DeepSpeed engine / compiled: unwrapped
      here); its forward receives `input_ids` and `labels` (or `targets`), or the job computes
      its loss with F.cross_entropy / F.nll_loss on the model's logits (NOTE [loss outside the model]).
    optimizer: the optimizer the job steps (accelerate's, Lightning's and DeepSpeed's wrappers
      are unwrapped to the torch.optim.Optimizer inside).
    factory: how gradcert's reference rebuilds the model, for a model that is not a Hugging Face
      PreTrainedModel: a module-level function or 'FILE.py:FUNC', FUNC(vocab_size, max_len).
    max_len: the max_len the factory is called with (default: the model's own, read from its
      config or a `max_len` / `block_size` / `max_seq_len` attribute, else the longest row seen).
    loader, accum: the job's DataLoader and accumulation steps, where the job has them: then
      batch.update_size holds the job to loader.batch_size x accum x world and the epoch's end
      is known (len(loader) / accum windows); without them, to what the job did.
    labels: 'hf' (labels as HF causal LMs take them, shifted by the model) or 'shifted'
      (labels[t] is position t's target); default: 'hf' for a `labels=` keyword, 'shifted' for
      `targets=` or a second positional argument.
    """
    if not observing():
        return NoOp()
    try:
        return Observer(model, optimizer, factory=factory, labels=labels, integration=integration,
                        job=dict(loader_facts(loader, accum), **(job or {})), max_len=max_len)
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
