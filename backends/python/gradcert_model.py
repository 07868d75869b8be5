"""Shared code of the PyTorch adapters (backends/PROTOCOL.md, version 1).

The same tiny causal LM as conformance/model.cpp, with the same canonical parameter
names; the protocol's inputs (plan.json, dataset.json, initial.safetensors); microbatch
collation; the loss sum S; the D*S/N rule; the optimizer; and the artifact writers
(rank<g>.json, manifest.json, u<k>.grads/params.safetensors).

Everything here is plain PyTorch; the strategy files (torch_ddp.py, torch_fsdp2.py,
torch_fsdp1.py) only decide how the model is wrapped and how gradients are reduced.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

PROTOCOL_VERSION = 1
EXIT_SKIP = 77  # "this stack cannot run here": the gradcert tests turn it into a SKIP

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def fail(msg: str, code: int = 2):
    print(f"gradcert adapter: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# --------------------------------------------------------------------------------------
# The model (conformance/model.cpp)
# --------------------------------------------------------------------------------------


class Block(nn.Module):
    """Pre-LN causal self-attention and MLP, each with a residual."""

    def __init__(self, d_model: int, heads: int, d_ff: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)  # NOTE [no key bias] in model.cpp
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.fc = nn.Linear(d_model, d_ff)
        self.fc_out = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)

        def split(t):
            return t.view(B, T, self.heads, hd).transpose(1, 2)

        q, k, v = split(q), split(k), split(v)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
        # Causal mask. With right padding, real positions never attend to padding.
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        att = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(B, T, C)
        h = x + self.proj(att)
        return h + self.fc_out(F.gelu(self.fc(self.ln2(h))))  # exact (erf) GELU


class TinyLM(nn.Module):
    """Canonical names: wte.weight, wpe.weight, blocks.<i>.{ln1,qkv,proj,ln2,fc,fc_out}.*,
    ln_f.*, lm_head.weight."""

    def __init__(self, m: dict):
        super().__init__()
        self.wte = nn.Embedding(m["vocab"], m["d_model"])
        self.wpe = nn.Embedding(m["max_len"], m["d_model"])
        self.blocks = nn.ModuleList(Block(m["d_model"], m["heads"], m["d_ff"]) for _ in range(m["layers"]))
        self.ln_f = nn.LayerNorm(m["d_model"], eps=1e-5)
        self.lm_head = nn.Linear(m["d_model"], m["vocab"], bias=False)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        T = input.size(1)
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(input) + self.wpe(pos).unsqueeze(0)
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def loss_sum(model: nn.Module, input: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """S: the sum of token cross-entropies over valid targets (logits in float32 for bf16)."""
    logits = model(input)
    if logits.dtype == torch.bfloat16:
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=ignore_index,
                           reduction="sum")


# --------------------------------------------------------------------------------------
# The protocol's inputs
# --------------------------------------------------------------------------------------


class Run:
    """The run's inputs, read from the GRADCERT_* environment (PROTOCOL.md)."""

    def __init__(self):
        env = os.environ
        for k in ("GRADCERT_PLAN", "GRADCERT_DATASET", "GRADCERT_INIT", "GRADCERT_OUT"):
            if k not in env:
                fail(f"{k} is not set: run me under `gradcert run --backend external`")
        with open(env["GRADCERT_PLAN"]) as f:
            self.plan = json.load(f)
        with open(env["GRADCERT_DATASET"]) as f:
            self.dataset = json.load(f)
        if self.plan.get("schema") != "gradcert.plan/1":
            fail(f"{env['GRADCERT_PLAN']}: schema {self.plan.get('schema')!r}, expected gradcert.plan/1")
        if self.dataset.get("schema") != "gradcert.dataset/1":
            fail(f"{env['GRADCERT_DATASET']}: schema {self.dataset.get('schema')!r}, expected gradcert.dataset/1")
        self.init_path = env["GRADCERT_INIT"]
        self.out = env["GRADCERT_OUT"]
        self.sampler = env.get("GRADCERT_SAMPLER", "plan")
        if self.sampler not in ("plan", "own"):
            fail(f"GRADCERT_SAMPLER={self.sampler!r}: expected 'plan' or 'own'")
        self.spec = self.plan["spec"]
        self.model_spec = self.spec["model"]
        self.dtype_name = self.spec["dtype"]
        if self.dtype_name not in DTYPES:
            fail(f"spec dtype {self.dtype_name!r} is not one of {sorted(DTYPES)}")
        self.dtype = DTYPES[self.dtype_name]
        topo = self.plan["topology"]
        self.dp, self.tp, self.pp = topo["dp"], topo["tp"], topo["pp"]
        self.micro = self.spec["batch"]["micro"]
        self.accum = self.spec["batch"]["accum"]
        self.windows = self.plan["windows"]
        self.windows_per_epoch = self.plan["windows_per_epoch"]
        self.ignore_index = self.dataset["ignore_index"]
        self.pad_token = self.dataset["pad_token"]
        self.samples = {s["id"]: s for s in self.dataset["samples"]}

    # ---- data -------------------------------------------------------------------------

    def collate(self, ids):
        """Examples right-padded to the longest (pad_token / ignore_index); None if empty."""
        if not ids:
            return None
        rows = [self.samples[i] for i in ids]
        T = max(1, max(len(s["tokens"]) for s in rows))
        inp = torch.full((len(rows), T), self.pad_token, dtype=torch.long)
        lab = torch.full((len(rows), T), self.ignore_index, dtype=torch.long)
        for i, s in enumerate(rows):
            n = len(s["tokens"])
            inp[i, :n] = torch.tensor(s["tokens"], dtype=torch.long)
            lab[i, :n] = torch.tensor(s["labels"], dtype=torch.long)
        valid = int((lab != self.ignore_index).sum())
        return inp, lab, valid

    def dummy_batch(self):
        """A one-token batch without targets: used by ranks with an empty microbatch that
        must still run the collectives a forward/backward triggers (its loss is x0)."""
        inp = torch.full((1, 1), self.pad_token, dtype=torch.long)
        lab = torch.full((1, 1), self.ignore_index, dtype=torch.long)
        return inp, lab, 0

    def plan_consumed(self, update: int, dp_rank: int):
        return [list(mb["ids"]) for mb in self.windows[update]["slots"][dp_rank]]

    def own_sampler_consumed(self, dp_rank: int):
        """GRADCERT_SAMPLER=own: torch's DistributedSampler (shuffle=False, drop_last=False)
        with a DataLoader of B_micro, A microbatches per update, the plan's number of
        updates; the iterator restarts at each epoch. Returns ids per update per microstep."""
        from torch.utils.data import DataLoader, DistributedSampler

        ids = sorted(self.samples)
        sampler = DistributedSampler(ids, num_replicas=self.dp, rank=dp_rank, shuffle=False, drop_last=False)
        loader = DataLoader(ids, batch_size=self.micro, sampler=sampler, drop_last=False)
        out, it = [], None
        for u in range(len(self.windows)):
            if u % self.windows_per_epoch == 0:
                sampler.set_epoch(u // self.windows_per_epoch)
                it = iter(loader)
            mbs = []
            for _ in range(self.accum):
                batch = next(it, None)
                mbs.append([] if batch is None else [int(x) for x in batch])
            out.append(mbs)
        return out

    # ---- weights ------------------------------------------------------------------------

    def build_model(self, dtype: torch.dtype) -> TinyLM:
        """The model in `dtype`, loaded from initial.safetensors (exact names and shapes)."""
        model = TinyLM(self.model_spec).to(dtype)
        init = load_file(self.init_path)
        names = dict(model.named_parameters())
        if set(init) != set(names):
            fail(f"{self.init_path}: names differ from the model: missing {sorted(set(names) - set(init))}, "
                 f"extra {sorted(set(init) - set(names))}")
        with torch.no_grad():
            for n, p in names.items():
                if tuple(init[n].shape) != tuple(p.shape):
                    fail(f"{self.init_path}: tensor '{n}' has shape {list(init[n].shape)}, model {list(p.shape)}")
                p.copy_(init[n].to(dtype))
        return model


# --------------------------------------------------------------------------------------
# The D*S/N rule
# --------------------------------------------------------------------------------------


def loss_scale(dp: int, window_targets: int, rank_targets: int, wrong: str | None = None) -> float:
    """What multiplies S_{r,a} before backward, for a reduction that averages over D ranks
    and sums over microsteps: D / N. `wrong` plants a bug for the tests."""
    if wrong == "local-mean":  # each rank normalises by its own targets, then ranks are averaged
        return 1.0 / rank_targets if rank_targets > 0 else 0.0
    if wrong is not None:
        fail(f"unknown --wrong {wrong!r} (known: local-mean)")
    return dp / window_targets if window_targets > 0 else 0.0


def allreduce_sum_f64(values, group=None):
    """Sums a few scalars over all ranks (float64 tensor; counts are exact below 2^53)."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.tolist()


# --------------------------------------------------------------------------------------
# The optimizer (PROTOCOL.md; model.cpp optimizer_step)
# --------------------------------------------------------------------------------------


class HandOptimizer:
    """Elementwise SGD / AdamW exactly as conformance/model.cpp writes them. Works on
    plain tensors and on DTensors (the arithmetic is elementwise, so shards are fine)."""

    def __init__(self, params, opt: dict):
        self.params = list(params)
        self.opt = opt
        self.state = {}
        self.step_count = 0

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        o = self.opt
        self.step_count += 1
        lr = o["lr"]
        for p in self.params:
            g = p.grad
            st = self.state.setdefault(id(p), {})
            if o["name"] == "sgd":
                d = g
                if o["weight_decay"] != 0:
                    d = d + o["weight_decay"] * p
                if o["momentum"] != 0:
                    if "m" not in st:
                        st["m"] = d.clone()
                    else:
                        st["m"].mul_(o["momentum"]).add_(d)
                    d = st["m"]
                p.add_(d, alpha=-lr)
                continue
            if "m" not in st:
                st["m"] = torch.zeros_like(p)
                st["v"] = torch.zeros_like(p)
            p.mul_(1 - lr * o["weight_decay"])
            st["m"].mul_(o["beta1"]).add_(g, alpha=1 - o["beta1"])
            st["v"].mul_(o["beta2"]).addcmul_(g, g, value=1 - o["beta2"])
            bc1 = 1 - o["beta1"] ** self.step_count
            bc2 = 1 - o["beta2"] ** self.step_count
            denom = (st["v"] / bc2).sqrt_().add_(o["eps"])
            p.addcdiv_(st["m"], denom, value=-lr / bc1)


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
# Process group and artifacts
# --------------------------------------------------------------------------------------


def init_process_group(run: Run):
    """Gloo on CPU, rendezvous from torchrun's environment, bounded collectives."""
    timeout_s = float(run.spec.get("timeout", {}).get("collective_s", 60.0)) or 60.0
    dist.init_process_group(backend="gloo", init_method="env://", timeout=timedelta(seconds=timeout_s))
    world, rank = dist.get_world_size(), dist.get_rank()
    if run.tp != 1 or run.pp != 1:
        fail(f"this adapter is data parallel only; the plan has tp={run.tp} pp={run.pp}")
    if world != run.dp:
        fail(f"started with world {world}, the plan's topology needs {run.dp} ranks")
    return rank, world


def _atomic_write(path: str, write):
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def write_json(path: str, obj):
    def w(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)

    _atomic_write(path, w)


def write_tensors(path: str, tensors: dict, dtype: torch.dtype, update: int):
    """Full canonical tensors in the spec's dtype (F64 / F32 / BF16)."""
    out = {n: t.detach().to(dtype).contiguous().clone() for n, t in tensors.items()}
    _atomic_write(path, lambda tmp: save_file(out, tmp, metadata={"update": str(update)}))


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


class Recorder:
    """Collects what rank<g>.json and manifest.json say, and writes them."""

    def __init__(self, run: Run, rank: int, world: int, backend: str):
        self.run, self.rank, self.world, self.backend = run, rank, world, backend
        self.rank_updates, self.manifest_updates = [], []
        self.memory = {}

    def record(self, update, consumed, loss_sum_r, targets_r, loss, N, step_seconds, grads, params):
        self.rank_updates.append({"update": update, "consumed": consumed, "loss_sum": loss_sum_r,
                                  "valid_targets": targets_r})
        gname, pname = f"u{update}.grads.safetensors", f"u{update}.params.safetensors"
        if self.rank == 0:
            write_tensors(os.path.join(self.run.out, gname), grads, self.run.dtype, update)
            write_tensors(os.path.join(self.run.out, pname), params, self.run.dtype, update)
        self.manifest_updates.append({"update": update, "loss": loss, "valid_targets": N,
                                      "step_seconds": step_seconds, "grads": gname, "params": pname})

    def finish(self, extra_versions=None, notes=None):
        write_json(os.path.join(self.run.out, f"rank{self.rank}.json"),
                   {"schema": "gradcert.rank/1", "rank": self.rank, "dp_rank": self.rank,
                    "updates": self.rank_updates})
        if self.rank == 0:
            m = {"schema": "gradcert.artifacts/1", "backend": self.backend, "world": self.world,
                 "updates": self.manifest_updates, "versions": versions(self.backend, extra_versions)}
            if notes:
                m["notes"] = notes
            m.update(self.memory)
            write_json(os.path.join(self.run.out, "manifest.json"), m)


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


def consumed_per_update(run: Run, dp_rank: int):
    if run.sampler == "own":
        return run.own_sampler_consumed(dp_rank)
    return [run.plan_consumed(u, dp_rank) for u in range(len(run.windows))]


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


def add_common_args(ap):
    ap.add_argument("--wrong", choices=["local-mean"], default=None,
                    help="plant a bug (for gradcert's own tests): local-mean = divide S by the rank's own targets")
    ap.add_argument("--optim", choices=["torch", "hand"], default=os.environ.get("GRADCERT_PY_OPTIM", "torch"),
                    help="torch.optim SGD/AdamW (default) or the elementwise hand-written copy of model.cpp")


def train(run: Run, rank: int, world: int, model: nn.Module, strategy: Strategy, optimizer, recorder: Recorder,
          wrong: str | None = None, masters: dict | None = None):
    """The protocol's loop: per update, N by all-reducing the local valid-target counts,
    backward of D*S_{r,a}/N per microstep (the wrapper averages over D and the microsteps
    accumulate), one optimizer step, artifacts. `masters` (bf16): name -> (param, fp32
    master); the optimizer steps the masters and the bf16 params are copied from them."""
    consumed_all = consumed_per_update(run, rank)
    for u in range(len(run.windows)):
        t0 = time.perf_counter()
        consumed = consumed_all[u]
        batches = [run.collate(ids) for ids in consumed]
        n_r = sum(b[2] for b in batches if b is not None)
        N = int(round(allreduce_sum_f64([n_r])[0]))  # every rank joins, zero-example ranks too
        scale = loss_scale(run.dp, N, n_r, wrong)
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        S_r = 0.0
        for a, b in enumerate(batches):
            last = a == len(batches) - 1
            if b is None and not (last or strategy.empty_microsteps_need_collectives):
                continue  # nothing to add, and no collective to join (e.g. DDP under no_sync)
            with strategy.microstep(last):
                if b is None:
                    # NOTE [empty microbatch] This rank has no example here, but the wrapper
                    # reduces gradients (and, for FSDP, gathers parameters) inside forward and
                    # backward, so it must run them like its peers: a one-token batch with no
                    # target, loss x 0. Every parameter stays in the graph (so DDP/FSDP hooks
                    # fire for all of them) and the gradient it adds is exactly zero.
                    inp, lab, _ = run.dummy_batch()
                    (loss_sum(model, inp, lab, run.ignore_index) * 0.0).backward()
                    continue
                inp, lab, _ = b
                S = loss_sum(model, inp, lab, run.ignore_index)
                (S * scale).backward()
                S_r += float(S.detach().to(torch.float64))
        if masters:
            for p, master in masters.values():
                master.grad = p.grad.detach().to(master.dtype)
        t_compute = time.perf_counter() - t0
        grads = strategy.full_grads()  # gathered outside the timed region (PROTOCOL.md)
        grads = {n: g.detach().clone() for n, g in grads.items()}
        t1 = time.perf_counter()
        optimizer.step()
        if masters:
            with torch.no_grad():
                for p, master in masters.values():
                    p.copy_(master.to(p.dtype))
        step_seconds = t_compute + time.perf_counter() - t1
        S_global = allreduce_sum_f64([S_r])[0]
        loss = S_global / N if N > 0 else 0.0
        params = strategy.full_params()
        recorder.record(u, consumed, S_r, n_r, loss, N, step_seconds, grads, params)
    recorder.memory = memory_per_rank(model, optimizer, masters)


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
    mine = [float(total), float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {"model_state_bytes": [e[0] for e in everyone],
            "peak_memory_bytes": [e[1] for e in everyone],
            "peak_memory_kind": "process high-water (ru_maxrss), per rank"}
