"""gradcert's client library: what a training stack (or a thin shim on one) needs to
speak backends/PROTOCOL.md, version 1. Plain PyTorch; no process group needed except
where a gather function the caller passes runs collectives.

    from gradcert.ref import client
    run = client.Run.from_env()              # GRADCERT_* -> plan, dataset, paths
    ids = run.plan.ids(update, dp_rank)      # per microstep: the example ids to consume
    batch = run.dataset.collate(ids[a])      # (input [B,T], labels [B,T], valid_targets) or None
    rec = client.GradRecorder(optimizer, named_parameters=model.named_parameters())
    ...train: backward D*S/N per microstep, optimizer.step() once per window...
    grads = rec.pop()                        # the reduced gradient captured just before step()
    writer = client.ArtifactWriter(run.out, rank, world, "my-stack", run.plan.dtype, dp_rank)
    writer.record(update, consumed, S_r, n_r, loss, N, step_seconds, grads, params)
    writer.finish()                          # rank<g>.json; rank 0 also manifest.json

Errors are `ProtocolError`s that name the file (and tensor).
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import NamedTuple

import torch
from safetensors.torch import load_file, save_file

from .. import _env
from . import PROTOCOL_VERSION
from . import factory as factory_mod

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


class ProtocolError(ValueError):
    pass


def _read_json(path: str, schema: str) -> dict:
    try:
        with open(path) as f:
            obj = json.load(f)
    except OSError as e:
        raise ProtocolError(f"{path}: cannot be read: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise ProtocolError(f"{path}: not JSON: {e}") from e
    if not isinstance(obj, dict) or obj.get("schema") != schema:
        got = obj.get("schema") if isinstance(obj, dict) else None
        raise ProtocolError(f"{path}: schema {got!r}, expected {schema}")
    return obj


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


class Plan:
    """plan.json: the spec, the topology, and per update / DP rank / microstep the ids."""

    def __init__(self, obj: dict, path: str = "plan.json"):
        self.obj, self.path = obj, path
        try:
            self.spec = obj["spec"]
            self.model_spec = self.spec["model"]
            self.dtype_name = self.spec["dtype"]
            topo = obj["topology"]
            self.dp, self.tp, self.pp = int(topo["dp"]), int(topo["tp"]), int(topo["pp"])
            self.micro = int(self.spec["batch"]["micro"])
            self.accum = int(self.spec["batch"]["accum"])
            self.windows = obj["windows"]
            self.windows_per_epoch = int(obj["windows_per_epoch"])
        except (KeyError, TypeError) as e:
            raise ProtocolError(f"{path}: missing field {e}") from e
        if self.dtype_name not in DTYPES:
            raise ProtocolError(f"{path}: spec dtype {self.dtype_name!r} is not one of {sorted(DTYPES)}")
        self.dtype = DTYPES[self.dtype_name]
        self.update_batch = int(obj.get("update_batch", self.micro * self.accum * self.dp))

    @classmethod
    def load(cls, path: str) -> "Plan":
        return cls(_read_json(path, "gradcert.plan/1"), path)

    def __len__(self):
        return len(self.windows)

    @property
    def factory(self) -> str | None:
        """spec.model.factory (None: the built-in tiny LM)."""
        return self.model_spec.get("factory") or None

    @property
    def optimizer(self) -> dict:
        return self.spec["optimizer"]

    @property
    def max_grad_norm(self) -> float:
        """optimizer.max_grad_norm (0 or absent: no clipping)."""
        return float(self.spec["optimizer"].get("max_grad_norm", 0.0) or 0.0)

    def window(self, update: int) -> dict:
        return self.windows[update]

    @property
    def observed(self) -> dict:
        """plan.json's `observed` section (a `gradcert observe` run: the job's own optimizer
        groups per update, its frozen parameters), {} for a planned run."""
        return self.obj.get("observed") or {}

    @property
    def frozen(self) -> set:
        """Parameters the observed job does not train (requires_grad=False): held unchanged."""
        return set(self.observed.get("frozen") or [])

    def hyper(self, update: int, name: str) -> dict:
        """The optimizer rule and hyperparameters parameter `name` is stepped with at `update`:
        the observed job's param group as that step used it (its schedule's lr included), else
        the spec's optimizer for every parameter."""
        per_update = (self.observed.get("optimizer") or {}).get("updates")
        if not per_update:
            return self.optimizer
        cache = self.__dict__.setdefault("_hyper", {})
        if update not in cache:
            cache[update] = {n: g for g in per_update[update] for n in g["params"]}
        try:
            return cache[update][name]
        except KeyError:
            raise ProtocolError(f"{self.path}: observed.optimizer.updates[{update}] has no group for "
                                f"parameter '{name}'") from None

    def ids(self, update: int, dp_rank: int) -> list:
        """The ids DP rank `dp_rank` consumes at each microstep of `update` (lists, maybe empty)."""
        return [list(mb["ids"]) for mb in self.windows[update]["slots"][dp_rank]]

    def window_targets(self, update: int) -> int:
        """N: the valid targets of the whole window (recounted for a partial one)."""
        return int(self.windows[update]["valid_targets"])

    def partial(self, update: int) -> bool:
        return bool(self.windows[update].get("partial", False))

    def dp_rank_of(self, global_rank: int) -> int:
        return global_rank // (self.tp * self.pp)


class Batch(NamedTuple):
    input: torch.Tensor  # [B, T] long, right-padded with pad_token
    labels: torch.Tensor  # [B, T] long, ignore_index where no target
    valid_targets: int


class Dataset:
    """dataset.json: tokens and (already shifted) labels per id."""

    def __init__(self, obj: dict, path: str = "dataset.json"):
        self.obj, self.path = obj, path
        try:
            self.ignore_index = int(obj["ignore_index"])
            self.pad_token = int(obj["pad_token"])
            self.samples = {int(s["id"]): s for s in obj["samples"]}
        except (KeyError, TypeError) as e:
            raise ProtocolError(f"{path}: missing field {e}") from e

    @classmethod
    def load(cls, path: str) -> "Dataset":
        return cls(_read_json(path, "gradcert.dataset/1"), path)

    def _row(self, i):
        try:
            return self.samples[int(i)]
        except KeyError:
            raise ProtocolError(f"{self.path}: no sample with id {i}") from None

    def collate(self, ids) -> Batch | None:
        """The protocol's microbatch: examples right-padded to the longest with pad_token /
        ignore_index; None if `ids` is empty."""
        if not ids:
            return None
        rows = [self._row(i) for i in ids]
        T = max(1, max(len(s["tokens"]) for s in rows))
        inp = torch.full((len(rows), T), self.pad_token, dtype=torch.long)
        lab = torch.full((len(rows), T), self.ignore_index, dtype=torch.long)
        for i, s in enumerate(rows):
            n = len(s["tokens"])
            inp[i, :n] = torch.tensor(s["tokens"], dtype=torch.long)
            lab[i, :n] = torch.tensor(s["labels"], dtype=torch.long)
        return Batch(inp, lab, int((lab != self.ignore_index).sum()))

    def dummy_batch(self) -> Batch:
        """A one-token batch without targets, for a rank with an empty microbatch that must
        still run the collectives a forward/backward triggers (its loss is x 0)."""
        return Batch(torch.full((1, 1), self.pad_token, dtype=torch.long),
                     torch.full((1, 1), self.ignore_index, dtype=torch.long), 0)

    def valid_targets(self, ids) -> int:
        return sum(sum(1 for l in self._row(i)["labels"] if l != self.ignore_index) for i in ids)

    def rows_with_targets(self, ids) -> int:
        """Rows with at least one valid target: what counting on unshifted labels adds to N
        (the test bed's mutant `unshifted-count`, testbed/mutants.py)."""
        return sum(1 for i in ids if any(l != self.ignore_index for l in self._row(i)["labels"]))


def collate(ids, dataset: Dataset) -> Batch | None:
    return dataset.collate(ids)


def own_sampler_ids(dataset: Dataset, plan: Plan, dp_rank: int) -> list:
    """GRADCERT_SAMPLER=own, the stack's usual sampling: DistributedSampler(num_replicas=D,
    rank=r, shuffle=False, drop_last=False), DataLoader(batch_size=B_micro), A microbatches
    per update, the plan's number of updates, the iterator restarted at each epoch.
    Returns ids per update per microstep."""
    from torch.utils.data import DataLoader, DistributedSampler

    ids = sorted(dataset.samples)
    sampler = DistributedSampler(ids, num_replicas=plan.dp, rank=dp_rank, shuffle=False, drop_last=False)
    loader = DataLoader(ids, batch_size=plan.micro, sampler=sampler, drop_last=False)
    out, it = [], None
    for u in range(len(plan)):
        if u % plan.windows_per_epoch == 0:
            sampler.set_epoch(u // plan.windows_per_epoch)
            it = iter(loader)
        mbs = []
        for _ in range(plan.accum):
            batch = next(it, None)
            mbs.append([] if batch is None else [int(x) for x in batch])
        out.append(mbs)
    return out


def load_weights(model: torch.nn.Module, path: str, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Copies initial.safetensors into the model's parameters (the exact set of names and
    shapes; cast to `dtype`, or to each parameter's own dtype)."""
    try:
        init = load_file(path)
    except Exception as e:
        raise ProtocolError(f"{path}: cannot be read as safetensors: {e}") from e
    if dtype is not None:
        model.to(dtype)
    names = dict(model.named_parameters())
    if set(init) != set(names):
        raise ProtocolError(f"{path}: names differ from the model: missing {sorted(set(names) - set(init))}, "
                            f"extra {sorted(set(init) - set(names))}")
    with torch.no_grad():
        for n, p in names.items():
            if tuple(init[n].shape) != tuple(p.shape):
                raise ProtocolError(f"{path}: tensor '{n}' has shape {list(init[n].shape)}, model {list(p.shape)}")
            p.copy_(init[n].to(p.dtype))
    return model


class Run:
    """A run's inputs: the plan, the dataset, the initial weights and where outputs go."""

    def __init__(self, plan_path: str, dataset_path: str, init_path: str, out: str, sampler: str = "plan"):
        self.plan = Plan.load(plan_path)
        self.dataset = Dataset.load(dataset_path)
        self.plan_path, self.dataset_path, self.init_path, self.out = plan_path, dataset_path, init_path, out
        if sampler not in ("plan", "own"):
            raise ProtocolError(f"GRADCERT_SAMPLER={sampler!r}: expected 'plan' or 'own'")
        self.sampler = sampler

    @classmethod
    def from_env(cls, env=None) -> "Run":
        env = os.environ if env is None else env
        for k in (_env.PLAN, _env.DATASET, _env.INIT, _env.OUT):
            if k not in env:
                raise ProtocolError(f"{k} is not set: run me under `gradcert run --backend external`")
        return cls(env[_env.PLAN], env[_env.DATASET], env[_env.INIT], env[_env.OUT], env.get(_env.SAMPLER, "plan"))

    @classmethod
    def from_dir(cls, run_dir: str, out: str | None = None) -> "Run":
        j = lambda f: os.path.join(run_dir, f)  # noqa: E731
        return cls(j("plan.json"), j("dataset.json"), j("initial.safetensors"), out or run_dir)

    def consumed(self, dp_rank: int) -> list:
        """Ids per update per microstep: the plan's, or the own sampler's (sampler audit)."""
        if self.sampler == "own":
            return own_sampler_ids(self.dataset, self.plan, dp_rank)
        return [self.plan.ids(u, dp_rank) for u in range(len(self.plan))]

    def build_model(self, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """The plan's model (spec.model.factory, else the built-in tiny LM) loaded from
        initial.safetensors, in `dtype`. Relative factory files are also looked up
        beside plan.json."""
        model = factory_mod.build_from_spec(self.plan.model_spec, search_dirs=[os.path.dirname(self.plan_path)])
        return load_weights(model, self.init_path, dtype)


# --------------------------------------------------------------------------------------
# Capturing the reduced gradient
# --------------------------------------------------------------------------------------


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: every rank must call), else the tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class GradRecorder:
    """Captures the reduced gradient of each window just before the optimizer steps, i.e.
    after the last microstep's backward (and its reduction), via
    `torch.optim.Optimizer.register_step_pre_hook`. That works for plain torch loops and
    for HF Trainer / accelerate, whose wrapped optimizers call the torch optimizer's
    step() (pass the underlying `torch.optim.Optimizer`, e.g. `accelerated.optimizer`).

    The gradient comes from `source()` (name -> tensor; it may gather, every rank calls
    step()), else from `named_parameters` (p.grad; DTensors gathered with full_tensor();
    a parameter without a gradient gives zeros). NOTE: a stack that clips gradients
    before step() is captured *after* clipping; gradcert's artifact is the pre-clip
    gradient, so such a shim calls `capture()` itself before clipping (the hook then
    keeps that capture: `capture()` marks the window as captured until `pop()`).
    """

    def __init__(self, optimizer, source=None, named_parameters=None):
        if source is None and named_parameters is None:
            raise ValueError("GradRecorder needs source() or named_parameters")
        self._named = list(named_parameters) if named_parameters is not None else None
        self._source = source
        self.last: dict | None = None
        self.seconds = 0.0  # time spent in the last capture (callers exclude it from step time)
        self.captures = 0
        self._handle = optimizer.register_step_pre_hook(self._hook)

    def _read(self) -> dict:
        if self._source is not None:
            return dict(self._source())
        return {n: (full_tensor(p.grad) if p.grad is not None else torch.zeros_like(full_tensor(p.detach())))
                for n, p in self._named}

    def capture(self) -> dict:
        t0 = time.perf_counter()
        self.last = {n: g.detach().clone() for n, g in self._read().items()}
        self.seconds = time.perf_counter() - t0
        self.captures += 1
        return self.last

    def _hook(self, optimizer, args, kwargs):
        if self.last is None:
            self.capture()

    def pop(self) -> dict:
        if self.last is None:
            raise RuntimeError("GradRecorder.pop(): no gradient captured since the last pop (no step()?)")
        out, self.last = self.last, None
        return out

    def remove(self):
        self._handle.remove()


# --------------------------------------------------------------------------------------
# Artifacts
# --------------------------------------------------------------------------------------


def _atomic_write(path: str, write):
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def measured(x):
    """A loss or loss sum as the protocol writes it: the number, or the string "nan", "inf" or
    "-inf" when it is not finite (a training finding gradcert reports, NOTE [non-finite values];
    JSON has no NaN). None stays None (not exposed)."""
    if x is None:
        return None
    x = float(x)
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return x


def write_json(path: str, obj):
    def w(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)

    _atomic_write(path, w)


def write_tensors(path: str, tensors: dict, dtype: torch.dtype, update: int | None = None, metadata=None):
    """Full tensors in `dtype` (the spec's: F64 / F32 / BF16), written atomically."""
    out = {n: t.detach().to("cpu", dtype).contiguous().clone() for n, t in tensors.items()}  # from CUDA too
    md = dict(metadata or {})
    if update is not None:
        md["update"] = str(update)
    _atomic_write(path, lambda tmp: save_file(out, tmp, metadata=md))


def shard_pieces(tensors: dict, dtype: torch.dtype, replica: int) -> tuple:
    """(NOTE [shard artifacts], conformance/protocol/artifacts.hpp) What this rank holds of each
    tensor, as (stored tensors, placement): a DTensor's local piece is a box at its global offset
    (torch.distributed.tensor's own computation), its replica group this rank's coordinate along
    the mesh dimensions it is replicated on; a plain tensor is held whole, in group `replica`."""
    stored, placement = {}, {}
    for n, t in tensors.items():
        t = t.detach()
        if hasattr(t, "to_local") and hasattr(t, "placements"):
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

            local = t.to_local()
            shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
            if tuple(local.shape) != tuple(shape):
                raise ProtocolError(f"tensor {n}: local shard {tuple(local.shape)} is not the {tuple(shape)} its "
                                    f"placement {t.placements} gives (padded?)")
            group, coord = 0, t.device_mesh.get_coordinate()
            for d, pl in enumerate(t.placements):
                if pl.is_partial():
                    raise ProtocolError(f"tensor {n}: a Partial placement is not a value (reduce it first)")
                if pl.is_replicate():
                    group = group * t.device_mesh.size(d) + coord[d]
            if local.numel() == 0:
                continue
            stored[n] = local.to("cpu", dtype).contiguous().clone()
            placement[n] = {"tensor": n, "shape": list(t.shape), "replica": group, "offset": list(offset)}
        else:
            stored[n] = t.to("cpu", dtype).contiguous().clone()
            placement[n] = {"tensor": n, "shape": list(t.shape), "replica": replica, "offset": [0] * t.dim()}
    return stored, placement


def load_stack_tensors(run_dir: str, files) -> dict:
    """A stack's tensors of one update as full tensors: `files` is the manifest entry's
    "grads" / "params", one file (schema 1) or a list of shard files (schema 2, NOTE [shard
    artifacts]), assembled from the lowest replica group's pieces (gradcert's reader has
    checked that they tile every tensor exactly once)."""
    if isinstance(files, str):
        return load_file(os.path.join(run_dir, files))
    from safetensors import safe_open

    pieces = []
    for name in files:
        path = os.path.join(run_dir, name)
        with safe_open(path, "pt") as f:
            placement = json.loads((f.metadata() or {}).get("gradcert.placement", "{}"))
            for key in f.keys():
                if key not in placement:
                    raise ProtocolError(f"{path}: tensor '{key}' has no entry in \"gradcert.placement\"")
                pieces.append((placement[key], f.get_tensor(key)))
    if not pieces:
        return {}
    lowest = min(int(p["replica"]) for p, _ in pieces)
    out = {}
    for p, t in pieces:
        if int(p["replica"]) != lowest:
            continue
        full = out.setdefault(p["tensor"], torch.empty(p["shape"], dtype=t.dtype))
        if "flat" in p:
            full.view(-1)[p["flat"][0]:p["flat"][1]] = t.reshape(-1)
        else:
            full[tuple(slice(o, o + n) for o, n in zip(p["offset"], t.shape))] = t
    return out


def tensor_digest(t: torch.Tensor) -> str:
    """(NOTE [replica digests], conformance/protocol/artifacts.hpp) A digest of the tensor's
    dtype, shape and exact bytes; ranks holding the same tensor must report the same one."""
    import hashlib

    c = t.detach().contiguous().cpu()
    raw = c.view(torch.int16) if c.dtype == torch.bfloat16 else c
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{c.dtype}:{tuple(c.shape)}:".encode())
    h.update(raw.numpy().tobytes())
    return h.hexdigest()


def replica_digests(named_tensors) -> dict:
    """name -> tensor_digest, for the tensors a rank holds whole (rank<g>.json "replicas")."""
    return {n: tensor_digest(t) for n, t in named_tensors}


def versions(adapter: str, extra: dict | None = None) -> dict:
    v = {"adapter": adapter, "torch": torch.__version__, "python": platform.python_version(),
         "protocol": PROTOCOL_VERSION}
    try:
        import safetensors

        v["safetensors"] = safetensors.__version__
    except Exception:
        pass
    if extra:
        v.update(extra)
    return v


def run_nonce(env=None) -> str | None:
    """GRADCERT_RUN_NONCE: this run's nonce, which rank<g>.json and manifest.json echo as
    "nonce" (gradcert refuses files without it or with another run's)."""
    env = os.environ if env is None else env
    return env.get(_env.RUN_NONCE) or None


def rank_json(rank: int, dp_rank: int, updates: list, nonce: str | None = None) -> dict:
    r = {"schema": "gradcert.rank/1", "rank": rank, "dp_rank": dp_rank, "updates": updates}
    if nonce is not None:
        r["nonce"] = nonce
    return r


def manifest_json(backend: str, world: int, updates: list, versions_: dict | None = None, nonce: str | None = None,
                  shards: bool = False, **extra) -> dict:
    schema = "gradcert.artifacts/2" if shards else "gradcert.artifacts/1"
    m = {"schema": schema, "backend": backend, "world": world, "updates": updates}
    if nonce is not None:
        m["nonce"] = nonce
    if versions_:
        m["versions"] = versions_
    m.update({k: v for k, v in extra.items() if v is not None})
    return m


class ArtifactWriter:
    """Collects what rank<g>.json and manifest.json say; rank 0 writes the tensors as each
    update completes and the manifest at the end. With `shards`, every rank writes what it
    holds of the tensors it is given (DTensors: their local pieces; plain tensors: whole, as
    the replica of its DP rank) to u<u>.rank<g>.{grads,params}.safetensors, and the manifest
    is schema 2 (NOTE [shard artifacts]): nothing is gathered."""

    def __init__(self, out: str, rank: int, world: int, backend: str, dtype: torch.dtype, dp_rank: int | None = None,
                 nonce: str | None = None, shards: bool = False):
        self.out, self.rank, self.world, self.backend, self.dtype = out, rank, world, backend, dtype
        self.shards = shards
        self.dp_rank = rank if dp_rank is None else dp_rank
        self.nonce = run_nonce() if nonce is None else nonce  # GRADCERT_RUN_NONCE
        self.rank_updates, self.manifest_updates = [], []
        self.memory = {}

    def record(self, update, consumed, loss_sum_r, targets_r, loss, N, step_seconds, grads, params, extra=None,
               replicas=None):
        # Written as given: gradcert refuses 3.0 or True where an id or a count belongs.
        # targets_r None: no per-rank count (the key is left out); loss / N None: the stack
        # exposes no such figure (JSON null: gradcert skips the check for that update).
        rec = {"update": update, "consumed": consumed, "loss_sum": measured(loss_sum_r)}
        if targets_r is not None:
            rec["valid_targets"] = targets_r
        if replicas:  # see NOTE [replica digests]: what this rank holds whole, after the step
            rec["replicas"] = replicas
        self.rank_updates.append(rec)
        gname, pname = f"u{update}.grads.safetensors", f"u{update}.params.safetensors"
        if self.shards:
            for kind, tensors in (("grads", grads), ("params", params)):
                stored, placement = shard_pieces(tensors, self.dtype, self.dp_rank)
                path = os.path.join(self.out, f"u{update}.rank{self.rank}.{kind}.safetensors")
                md = {"update": str(update), "gradcert.placement": json.dumps(placement)}
                _atomic_write(path, lambda tmp: save_file(stored, tmp, metadata=md))
            gname = [f"u{update}.rank{r}.grads.safetensors" for r in range(self.world)]
            pname = [f"u{update}.rank{r}.params.safetensors" for r in range(self.world)]
        elif self.rank == 0:
            write_tensors(os.path.join(self.out, gname), grads, self.dtype, update)
            write_tensors(os.path.join(self.out, pname), params, self.dtype, update)
        entry = {"update": update, "loss": measured(loss), "valid_targets": N, "step_seconds": step_seconds,
                 "grads": gname, "params": pname}
        entry.update(extra or {})
        self.manifest_updates.append(entry)

    def finish(self, extra_versions=None, notes=None, extra=None):
        write_json(os.path.join(self.out, f"rank{self.rank}.json"),
                   rank_json(self.rank, self.dp_rank, self.rank_updates, self.nonce))
        if self.rank == 0:
            m = manifest_json(self.backend, self.world, self.manifest_updates,
                              versions(self.backend, extra_versions), nonce=self.nonce, shards=self.shards, notes=notes)
            m.update(self.memory)
            m.update(extra or {})
            write_json(os.path.join(self.out, "manifest.json"), m)
