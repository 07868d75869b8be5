"""The float64 reference for a user's own PyTorch model (the Python reference runner).

    python -m gradcert.ref.reference --run-dir DIR [--factory F] [--out DIR/reference]
        [--init FILE] [--no-pieces] [--ids-from-ranks [DIR]] [--threads N]

DIR holds plan.json, dataset.json and initial.safetensors (a `gradcert run --backend
external` folder). The factory defaults to the plan's spec.model.factory, else the
built-in tiny LM. One process; the model cast to float64 and loaded from
initial.safetensors; per window of the plan, every example of the window in ONE
concatenated batch (right-padded to the window's longest), gradcert's loss
L = S / N (S: the sum of token cross-entropies over valid targets, on float64 logits,
computed here: never the model's own loss; N: the window's valid targets), one backward;
then the protocol's optimizer (PROTOCOL.md "The model and the rule", model.cpp's
optimizer_step, step counted from 1; a parameter without a gradient steps with zeros).

Clipping: spec.optimizer.max_grad_norm > 0 scales the whole gradient by
min(1, max_norm / (total_norm + 1e-6)), total_norm the L2 norm over all tensors (the
formula of torch.nn.utils.clip_grad_norm_), before the step. The grads artifact stays
the pre-clip gradient.

Outputs (in the format a stack writes, float64): manifest.json (per update loss, N,
grads, params, and grad_norm / clip_coef, pieces), u<k>.grads.safetensors,
u<k>.params.safetensors; and per (update, DP rank r, microstep a) the gradient of that
piece's loss SUM S_{r,a} (one backward per microbatch, at the update's parameters):
u<k>.pieces.safetensors with tensors `r<r>.a<a>.<param>` (zeros for an empty piece) and
u<k>.pieces.json listing each piece's ids, loss_sum, valid_targets, rows_with_targets
and unshifted_targets (= valid + rows with targets), so a diagnosis can form candidate
objectives as linear combinations (the test bed's backends/python/testbed/mutants.py
`coefficients`).
sum_{r,a} piece / N equals the window's gradient up to rounding.

Teacher forcing and noise floors (with --pieces-at; NOTE [teacher forcing] and NOTE [noise
floor] in conformance/model/reference.cpp): each manifest entry also carries `forced` (the
loss, N, u<k>.forced.grads.safetensors and u<k>.forced.params.safetensors: the gradient at
the stack's parameters after update u-1 and one step from there, the optimizer state built
from the forced gradients) with its one-step `floor`, and a `floor` of the free-running
trajectory: {grad, scale, loss, params}, the distance to a second, mathematically equal route
(per-microbatch pieces in float64 runs; the concatenated batch in the run's dtype otherwise).

Precision: the manifest's `precision` says whether the model computes in lower
precision internally although cast to float64: a TorchFunctionMode records every op
whose floating output is not float64 (with the module it ran in), forward hooks record
modules whose outputs are not float64, and parameters / buffers left in another dtype
are listed. `float64_throughout: false` means the reference is not a float64 reference.

--ids-from-ranks [DIR]: take each (update, DP rank, microstep)'s ids from the
rank<g>.json a stack wrote (into DIR, default the run folder; sampler audit), not from
the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.overrides import TorchFunctionMode

from . import client
from . import factory as factory_mod

F64 = torch.float64
BACKEND = "gradcert-reference-python"


def loss_sum(model, batch: client.Batch, ignore_index: int, factory=None, vocab=None) -> torch.Tensor:
    """gradcert's S on float64 logits (the model's own loss is never used)."""
    logits = factory_mod.logits_of(model(batch.input), factory)
    if vocab is not None:
        factory_mod.check_logits(logits, batch.input.size(0), batch.input.size(1), vocab, factory)
    logits = logits.to(F64)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1),
                           ignore_index=ignore_index, reduction="sum")


# --------------------------------------------------------------------------------------
# Precision probe
# --------------------------------------------------------------------------------------


def _floating(x):
    out = []
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex():
            out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            out += _floating(y)
    elif isinstance(x, dict):
        for y in x.values():
            out += _floating(y)
    elif hasattr(x, "logits"):
        out += _floating(x.logits)
    return out


class _OpDtypes(TorchFunctionMode):
    def __init__(self, stack, found):
        super().__init__()
        self.stack, self.found = stack, found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in _floating(out):
            if t.dtype != F64:
                where = self.stack[-1] if self.stack else "<root>"
                key = (where, getattr(func, "__name__", str(func)), str(t.dtype).replace("torch.", ""))
                self.found[key] = self.found.get(key, 0) + 1
        return out


def probe_precision(model, batch: client.Batch) -> dict:
    """Runs one forward (no grad) and reports where the model leaves float64."""
    names = {m: (n or "<root>") for n, m in model.named_modules()}
    stack, modules, ops = [], {}, {}

    def pre(m, args):
        stack.append(names[m])

    def post(m, args, out):
        stack.pop()
        bad = sorted({str(t.dtype).replace("torch.", "") for t in _floating(out) if t.dtype != F64})
        if bad:
            modules[names[m]] = {"module": names[m], "type": type(m).__name__, "output_dtypes": bad}

    handles = [m.register_forward_pre_hook(pre) for m in names] + [m.register_forward_hook(post) for m in names]
    try:
        with torch.no_grad(), _OpDtypes(stack, ops):
            out = model(batch.input)
    finally:
        for h in handles:
            h.remove()
    logits = factory_mod.logits_of(out)
    params = [f"{n}: {str(p.dtype).replace('torch.', '')}" for n, p in model.named_parameters() if p.dtype != F64]
    buffers = [f"{n}: {str(b.dtype).replace('torch.', '')}" for n, b in model.named_buffers()
               if b.is_floating_point() and b.dtype != F64]
    op_list = [{"module": w, "op": f, "dtype": d, "count": c} for (w, f, d), c in sorted(ops.items())]
    return {"float64_throughout": not (modules or op_list or params or buffers) and logits.dtype == F64,
            "logits_dtype": str(logits.dtype).replace("torch.", ""),
            "lower_precision_modules": list(modules.values()), "lower_precision_ops": op_list,
            "non_float64_parameters": params, "non_float64_buffers": buffers,
            "how": "one forward of the first non-empty microbatch in float64: module outputs (forward hooks) and "
                   "every op's floating outputs (TorchFunctionMode) that are not float64"}


# --------------------------------------------------------------------------------------
# Optimizer (model.cpp optimizer_step) and clipping
# --------------------------------------------------------------------------------------


@torch.no_grad()
def optimizer_step(opt: dict, step: int, p: torch.Tensor, g: torch.Tensor, slot: dict):
    """One step of the protocol's rule `opt["name"]`: sgd, adamw (decoupled decay) or adam
    (torch.optim.Adam: the decay added to the gradient), step counted from 1."""
    if opt["name"] == "sgd":
        d = g
        if opt["weight_decay"] != 0:
            d = d + opt["weight_decay"] * p
        if opt["momentum"] != 0:
            if "m" not in slot:
                slot["m"] = d.clone()
            else:
                slot["m"].mul_(opt["momentum"]).add_(d)
            d = slot["m"]
        p.add_(d, alpha=-opt["lr"])
        return
    if opt["name"] not in ("adamw", "adam"):
        raise ValueError(f"unknown optimizer {opt['name']!r} (sgd | adamw | adam)")
    if "m" not in slot:
        slot["m"], slot["v"] = torch.zeros_like(p), torch.zeros_like(p)
    lr = opt["lr"]
    if opt["name"] == "adam":
        if opt["weight_decay"] != 0:
            g = g + opt["weight_decay"] * p
    else:
        p.mul_(1 - lr * opt["weight_decay"])
    slot["m"].mul_(opt["beta1"]).add_(g, alpha=1 - opt["beta1"])
    slot["v"].mul_(opt["beta2"]).addcmul_(g, g, value=1 - opt["beta2"])
    bc1 = 1 - opt["beta1"] ** step
    bc2 = 1 - opt["beta2"] ** step
    denom = (slot["v"] / bc2).sqrt_().add_(opt["eps"])
    p.addcdiv_(slot["m"], denom, value=-lr / bc1)


def clip_coefficient(grads: dict, max_norm: float):
    """(total L2 norm, the factor clip_grad_norm_ applies: min(1, max/(norm + 1e-6)))."""
    norms = [torch.linalg.vector_norm(g.to(F64)) for g in grads.values()]
    total = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
    if max_norm <= 0:
        return total, 1.0
    return total, min(1.0, max_norm / (total + 1e-6))


# --------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------


def _ids_from_ranks(run_dir: str, plan: client.Plan) -> list:
    """[update][dp_rank][micro] -> ids, from the rank<g>.json of DP ranks' first members."""
    per = [[None] * plan.dp for _ in range(len(plan))]
    for r in range(plan.dp):
        g = r * plan.tp * plan.pp
        path = os.path.join(run_dir, f"rank{g}.json")
        try:
            with open(path) as f:
                obj = json.load(f)
        except (OSError, ValueError) as e:
            raise client.ProtocolError(f"{path}: cannot be read: {e}") from e
        for u in obj["updates"]:
            per[u["update"]][r] = [list(ids) for ids in u["consumed"]]
    for u, ranks in enumerate(per):
        for r, slots in enumerate(ranks):
            if slots is None:
                raise client.ProtocolError(f"{run_dir}/rank{r * plan.tp * plan.pp}.json: no update {u}")
    return per


def _grads(model) -> dict:
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in
            model.named_parameters()}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    d = float(torch.linalg.vector_norm((a.to(F64) - b.to(F64)).reshape(-1)))
    n = float(torch.linalg.vector_norm(b.to(F64).reshape(-1)))
    return d / n if n > 0 else d


def floor_between(grads_b: dict, loss_b: float, params_b: dict, grads_a: dict, loss_a: float, params_a: dict) -> dict:
    """How far the second route lands (NOTE [noise floor] in conformance/model/reference.cpp)."""
    dot = sum(float((grads_b[n].to(F64) * g.to(F64)).sum()) for n, g in grads_a.items())
    rr = sum(float((g.to(F64) * g.to(F64)).sum()) for g in grads_a.values())
    return {"grad": max((_relative(grads_b[n], g) for n, g in grads_a.items()), default=0.0),
            "scale": abs(dot / rr - 1) if rr > 0 else 0.0,
            "loss": abs(loss_b - loss_a) / abs(loss_a) if loss_a != 0 else abs(loss_b),
            "params": max((_relative(params_b[n], q) for n, q in params_a.items()), default=0.0)}


class Route:
    """One model stepped by the protocol's optimizer, its gradient by one route: the window
    concatenated (pieces=False) or one backward per (DP rank, microstep) of S_{r,a} / N.
    bfloat16 steps a float32 master of the bf16 weights (NOTE [mixed precision])."""

    def __init__(self, model, dtype, pieces: bool, plan: client.Plan, max_norm: float):
        self.model, self.dtype, self.pieces, self.plan, self.max_norm = model, dtype, pieces, plan, max_norm
        freeze(model, plan)
        self.slots = {n: {} for n, _ in model.named_parameters()}
        self.masters = {}

    def load(self, params: dict, where: str):
        with torch.no_grad():
            for n, q in self.model.named_parameters():
                if n not in params:
                    raise client.ProtocolError(f"{where}: no tensor '{n}'")
                q.copy_(params[n].to(q.dtype))
        self.masters = {}

    def evaluate(self, data, ids, slots, fname, vocab):
        m = self.model
        m.zero_grad(set_to_none=True)
        loss = 0.0
        if not self.pieces:
            batch = data.collate(ids)
            N = batch.valid_targets if batch is not None else 0
            if N > 0:
                L = loss_sum(m, batch, data.ignore_index, fname, vocab) / N
                L.backward()
                loss = float(L.detach())
        else:
            batches = [data.collate(mb) for r in slots for mb in r if mb]
            batches = [b for b in batches if b is not None]
            N = sum(b.valid_targets for b in batches)
            if N > 0:
                S_total = 0.0
                for b in batches:
                    s = loss_sum(m, b, data.ignore_index, fname, vocab)
                    (s / N).backward()
                    S_total += float(s.detach())
                loss = S_total / N
        return loss, N, _grads(m)

    @torch.no_grad()
    def step(self, u: int, grads: dict):
        _, coef = clip_coefficient(grads, self.max_norm)
        for n, p in self.model.named_parameters():
            if not p.requires_grad:  # a frozen parameter of an observed job: never stepped
                continue
            g = grads[n] if coef == 1.0 else grads[n] * coef
            opt = self.plan.hyper(u, n)
            if self.dtype != torch.bfloat16:
                optimizer_step(opt, u + 1, p, g.to(p.dtype), self.slots[n])
                continue
            if n not in self.masters:
                self.masters[n] = p.detach().to(torch.float32)
            optimizer_step(opt, u + 1, self.masters[n], g.to(torch.float32), self.slots[n])
            p.copy_(self.masters[n])

    def params(self) -> dict:
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}


def freeze(model, plan: client.Plan):
    """The observed job's frozen parameters (requires_grad=False) stay so here: no gradient
    (the artifacts carry zeros), never stepped."""
    frozen = plan.frozen
    for n, p in model.named_parameters():
        if n in frozen:
            p.requires_grad_(False)
    return model


@dataclass
class _Job:
    """What every step of run_reference reads: the run's plan and data, the factory, the folders."""

    run_dir: str
    plan: client.Plan
    data: client.Dataset
    out: str
    factory: str | None
    fname: str
    vocab: int
    init: str

    def build(self, dtype) -> torch.nn.Module:
        """A fresh model of the factory, loaded from the initial weights in `dtype`."""
        m = factory_mod.build(self.factory, int(self.plan.model_spec["vocab"]), int(self.plan.model_spec["max_len"]),
                              spec=self.plan.model_spec, search_dirs=[self.run_dir])
        client.load_weights(m, self.init, dtype)
        return m


def _open_job(run_dir: str, factory: str | None, out: str | None, init: str | None) -> _Job:
    """Reads the run folder, creates the output folder and resolves the factory."""
    run = client.Run.from_dir(run_dir)
    plan = run.plan
    out = out or os.path.join(run_dir, "reference")
    os.makedirs(out, exist_ok=True)
    factory = factory or plan.factory
    return _Job(run_dir, plan, run.dataset, out, factory, factory or factory_mod.BUILTIN,
                int(plan.model_spec["vocab"]), init or run.init_path)


def _reference_model(job: _Job) -> torch.nn.Module:
    """The float64 model the reference steps (frozen parameters kept frozen), in train mode."""
    model = job.build(F64)
    freeze(model, job.plan)
    model.train()
    return model


def _check_precision(job: _Job, model, slots_all: list, log) -> dict:
    """The precision probe on the first non-empty microbatch; warns through `log` below float64."""
    first = next((ids for u in slots_all for r in u for ids in r if ids), None)
    precision = probe_precision(model, job.data.collate(first[:1])) if first else {"float64_throughout": None}
    if precision.get("float64_throughout") is False and log:
        log(f"gradcert reference: WARNING: model factory '{job.fname}' computes below float64 "
            f"(see manifest precision): {precision['lower_precision_modules'][:3]} "
            f"{precision['lower_precision_ops'][:3]}")
    return precision


def _window_gradient(job: _Job, model, ids: list):
    """(loss, N, grads) of the window's concatenated batch: one backward of L = S / N."""
    data = job.data
    batch = data.collate(ids)
    N = batch.valid_targets if batch is not None else 0
    model.zero_grad(set_to_none=True)
    loss = 0.0
    if batch is not None and N > 0:
        L = loss_sum(model, batch, data.ignore_index, job.fname, job.vocab) / N
        L.backward()
        loss = float(L.detach())
    return loss, N, _grads(model)


def _write_pieces(job: _Job, u: int, at, slots: list, N: int) -> dict:
    """Writes u<k>.pieces.*: per (DP rank, microstep) the gradient of its loss sum at `at`'s parameters."""
    data = job.data
    ptensors, pmeta = {}, []
    for r, per_rank in enumerate(slots):
        for a, mb in enumerate(per_rank):
            at.zero_grad(set_to_none=True)
            b = data.collate(mb)
            S = 0.0
            if b is not None:
                s = loss_sum(at, b, data.ignore_index, job.fname, job.vocab)
                s.backward()
                S = float(s.detach())
            for n, g in _grads(at).items():
                ptensors[f"r{r}.a{a}.{n}"] = g
            n_ra = b.valid_targets if b is not None else 0
            rows = data.rows_with_targets(mb)
            pmeta.append({"dp_rank": r, "micro": a, "ids": list(mb), "loss_sum": S, "valid_targets": n_ra,
                          "rows_with_targets": rows, "unshifted_targets": n_ra + rows})
    at.zero_grad(set_to_none=True)
    client.write_tensors(os.path.join(job.out, f"u{u}.pieces.safetensors"), ptensors, F64, u)
    client.write_json(os.path.join(job.out, f"u{u}.pieces.json"),
                      {"schema": "gradcert.pieces/1", "update": u, "dp": job.plan.dp, "accum": job.plan.accum,
                       "partial": job.plan.partial(u), "valid_targets": N, "pieces": pmeta,
                       "tensors": "r<dp_rank>.a<micro>.<param>: grad of the piece's loss sum S_{r,a}"})
    return {"pieces": f"u{u}.pieces.safetensors", "pieces_json": f"u{u}.pieces.json"}


class _Forcing:
    """With --pieces-at: pmodel at the stack's parameters, the teacher-forced routes, the free second route."""

    def __init__(self, job: _Job, pieces_at: str):
        self.job, self.pieces_at = job, pieces_at
        plan = job.plan
        self.pmodel = job.build(F64)
        freeze(self.pmodel, plan)
        self.pmodel.train()
        stack_manifest = os.path.join(pieces_at, "manifest.json")
        try:
            with open(stack_manifest) as f:
                self.stack_updates = json.load(f)["updates"]
        except (OSError, ValueError, KeyError) as e:
            raise client.ProtocolError(f"{stack_manifest}: cannot be read for --pieces-at: {e}") from e

        # Teacher forcing and noise floors (NOTE [teacher forcing], NOTE [noise floor] in
        # conformance/model/reference.cpp): with the
        # stack's parameters (pieces_at), update u is also computed at the stack's parameters after
        # update u-1 ("forced": the gradient there and one step from there), and each update a
        # second, mathematically equal way: per-microbatch pieces in float64 runs, the
        # concatenated batch in the run's dtype otherwise; the distance is the update's floor.
        run_dtype = plan.dtype
        route_dtype, route_pieces = (F64, True) if run_dtype == F64 else (run_dtype, False)
        self.free_b = self._route(route_dtype, route_pieces)
        self.forced_a = Route(self.pmodel, F64, False, plan, plan.max_grad_norm)
        self.forced_b = self._route(route_dtype, route_pieces)
        self.initial_params = {n: p.detach().clone() for n, p in self.pmodel.named_parameters()}
        self.fb_loss, self.fb_grads = None, None

    def _route(self, dtype, pieces_route: bool) -> Route:
        """A fresh model in `dtype` stepped as a Route (the second route of the noise floor)."""
        m = self.job.build(dtype)
        m.train()
        return Route(m, dtype, pieces_route, self.job.plan, self.job.plan.max_grad_norm)

    def stand_at_stack(self, u: int):
        """pmodel at the stack's parameters after update u-1 (update 0: the initial weights)."""
        if u > 0:  # the stack's parameters after update u-1
            stack_updates, pieces_at = self.stack_updates, self.pieces_at
            path = os.path.join(pieces_at, str(stack_updates[u - 1]["params"]))
            try:
                stack_params = client.load_stack_tensors(pieces_at, stack_updates[u - 1]["params"])
            except Exception as e:
                raise client.ProtocolError(f"{path}: cannot be read for --pieces-at: {e}") from e
            with torch.no_grad():
                for n, q in self.pmodel.named_parameters():
                    if n not in stack_params:
                        raise client.ProtocolError(f"{path}: no tensor '{n}'")
                    q.copy_(stack_params[n].to(F64))
        return self.pmodel

    def forced(self, u: int, ids: list, slots: list) -> dict:
        """Update u teacher-forced (written as u<k>.forced.*) with its floor; then the free second route's step."""
        job, data, fname, vocab = self.job, self.job.data, self.job.fname, self.job.vocab
        forced_a, forced_b = self.forced_a, self.forced_b
        # pmodel stands at the stack's parameters after update u-1 (update 0: the initial weights).
        at_params = self.initial_params if u == 0 else \
            {n: q.detach().clone() for n, q in self.pmodel.named_parameters()}
        where = f"{self.pieces_at}: update {u - 1} parameters"
        f_loss, f_N, f_grads = forced_a.evaluate(data, ids, slots, fname, vocab)
        forced_a.load(at_params, where)  # evaluate() keeps the parameters; step from them
        forced_a.step(u, f_grads)
        f_params = forced_a.params()
        forced_b.load(at_params, where)
        b_loss, _, b_grads = forced_b.evaluate(data, ids, slots, fname, vocab)
        forced_b.step(u, b_grads)
        client.write_tensors(os.path.join(job.out, f"u{u}.forced.grads.safetensors"), f_grads, F64, u)
        client.write_tensors(os.path.join(job.out, f"u{u}.forced.params.safetensors"), f_params, F64, u)
        entry = {"loss": f_loss, "valid_targets": f_N, "grads": f"u{u}.forced.grads.safetensors",
                 "params": f"u{u}.forced.params.safetensors",
                 "floor": floor_between(b_grads, b_loss, forced_b.params(), f_grads, f_loss, f_params)}
        self.fb_loss, _, self.fb_grads = self.free_b.evaluate(data, ids, slots, fname, vocab)
        self.free_b.step(u, self.fb_grads)
        return entry

    def free_floor(self, grads: dict, loss: float, model) -> dict:
        """The free-running trajectory's floor: the second route's update against the reference's."""
        return floor_between(self.fb_grads, self.fb_loss, self.free_b.params(), grads, loss,
                             {n: p.detach() for n, p in model.named_parameters()})


def _step_reference(model, plan: client.Plan, u: int, grads: dict, coef: float, slots_state: dict):
    """The protocol's optimizer step of update u on the reference model (the gradient scaled by `coef`)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if not p.requires_grad:
                continue
            g = grads[n] if coef == 1.0 else grads[n] * coef
            optimizer_step(plan.hyper(u, n), u + 1, p, g, slots_state[n])


def _write_manifest(job: _Job, updates: list, ids_from_ranks, pieces: bool, forcing, precision: dict) -> dict:
    """Writes manifest.json of the reference's updates; returns it."""
    plan = job.plan
    manifest = client.manifest_json(
        BACKEND, 1, updates, client.versions(BACKEND, {"factory": job.fname}),
        notes="float64 reference, one process, one concatenated batch per window; loss = sum of token "
              "cross-entropies over valid targets / N (gradcert's, not the model's)",
        reference={"factory": job.fname, "dtype": "float64", "ids": "rank files" if ids_from_ranks else "plan",
                   "dp": plan.dp, "accum": plan.accum, "max_grad_norm": plan.max_grad_norm, "pieces": pieces,
                   "pieces_at": "stack" if forcing is not None else "reference"},
        precision=precision)
    client.write_json(os.path.join(job.out, "manifest.json"), manifest)
    return manifest


def run_reference(run_dir: str, factory: str | None = None, out: str | None = None, init: str | None = None,
                  pieces: bool = True, ids_from_ranks: bool = False, log=None, pieces_at: str | None = None) -> dict:
    """Writes the reference artifacts into `out` (default run_dir/reference); returns the manifest.

    NOTE [pieces at the stack's parameters] `pieces_at` = a folder with the stack's artifacts
    (its manifest.json and u<k>.params.safetensors): the pieces of update u are then the
    gradients at the *stack's* parameters after update u-1 (update 0: the initial weights),
    teacher forcing: whatever the stack did to earlier updates, the diagnosis of update u
    judges the gradient it computed from where it stood. Without it the pieces are at the
    reference's own parameters, valid only while the stack has not diverged."""
    job = _open_job(run_dir, factory, out, init)
    plan = job.plan
    model = _reference_model(job)
    ranks_dir = ids_from_ranks if isinstance(ids_from_ranks, str) else run_dir
    slots_all = _ids_from_ranks(ranks_dir, plan) if ids_from_ranks else \
        [[plan.ids(u, r) for r in range(plan.dp)] for u in range(len(plan))]
    precision = _check_precision(job, model, slots_all, log)
    forcing = _Forcing(job, pieces_at) if pieces and pieces_at else None
    slots_state = {n: {} for n, _ in model.named_parameters()}
    updates = []
    for u in range(len(plan)):
        t0 = time.perf_counter()
        slots = slots_all[u]
        ids = [i for r in slots for mb in r for i in mb] if ids_from_ranks else list(plan.window(u)["ids"])
        loss, N, grads = _window_gradient(job, model, ids)
        entry = {"update": u, "loss": loss, "valid_targets": N, "plan_valid_targets": plan.window_targets(u),
                 "grads": f"u{u}.grads.safetensors", "params": f"u{u}.params.safetensors"}
        if pieces:
            at = forcing.stand_at_stack(u) if forcing is not None else model
            entry.update(_write_pieces(job, u, at, slots, N))
        if forcing is not None:
            entry["forced"] = forcing.forced(u, ids, slots)
        total, coef = clip_coefficient(grads, plan.max_grad_norm)
        entry.update({"grad_norm": total, "clip_coef": coef})
        _step_reference(model, plan, u, grads, coef, slots_state)
        if forcing is not None:
            entry["floor"] = forcing.free_floor(grads, loss, model)
        entry["step_seconds"] = time.perf_counter() - t0
        client.write_tensors(os.path.join(job.out, entry["grads"]), grads, F64, u)
        client.write_tensors(os.path.join(job.out, entry["params"]),
                             {n: p.detach() for n, p in model.named_parameters()}, F64, u)
        updates.append(entry)
    return _write_manifest(job, updates, ids_from_ranks, pieces, forcing, precision)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gradcert.ref.reference", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, help="folder with plan.json, dataset.json, initial.safetensors")
    ap.add_argument("--factory", default=None, help="FILE.py:FUNC or module:FUNC (default: the plan's, else the tiny LM)")
    ap.add_argument("--out", default=None, help="where the reference artifacts go (default: RUN_DIR/reference)")
    ap.add_argument("--init", default=None, help="initial weights (default: RUN_DIR/initial.safetensors)")
    ap.add_argument("--no-pieces", action="store_true", help="skip the per-(rank, microstep) piece gradients")
    ap.add_argument("--ids-from-ranks", nargs="?", const=True, default=False, metavar="DIR",
                    help="ids from the rank<g>.json a stack wrote (in DIR, default RUN_DIR): sampler audit")
    ap.add_argument("--pieces-at", default=None, metavar="DIR",
                    help="compute each update's pieces at the stack's parameters after the previous update "
                         "(its u<k>.params.safetensors in DIR; teacher forcing for the diagnosis)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1") or 1),
                    help="torch intra-op threads (default: $OMP_NUM_THREADS, else 1: gradcert's models are tiny, "
                         "and more threads than free cores slow float64 CPU kernels down by orders of magnitude)")
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, a.threads))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        m = run_reference(a.run_dir, a.factory, a.out, a.init, not a.no_pieces, a.ids_from_ranks,
                          log=lambda s: print(s, file=sys.stderr), pieces_at=a.pieces_at)
    except (client.ProtocolError, factory_mod.FactoryError, OSError, ValueError) as e:
        print(f"gradcert reference: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": a.out or os.path.join(a.run_dir, "reference"), "updates": len(m["updates"]),
                      "losses": [u["loss"] for u in m["updates"]],
                      "float64_throughout": m["precision"].get("float64_throughout")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
