"""The targets of a job that computes its loss outside the model (NOTE [loss outside the model]).

    logits = model(ids)                                   # no labels: the forward cannot say
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1),
                           ignore_index=-100, reduction="sum")

NOTE [loss outside the model] When a training forward of the watched model gets no labels, the
recorder keeps its (detached) logits and waits for the job's own loss call:
`torch.nn.functional.cross_entropy` and `nll_loss` are wrapped (nn.CrossEntropyLoss and
nn.NLLLoss call them), and a call whose input rows are rows of a waiting forward's logits -- a
shifted slice, a reshape, a transpose to [B, V, T], a `.float()` upcast, or, for nll_loss,
their log_softmax -- tells which positions are targets and what they are. Rows are matched by
value: a random projection of every position's logits sorts them, and a candidate is accepted
only when the whole row is equal (a cast: to the cast's rounding; log_softmax: to a few
units of its dtype). Two positions with identical logits (rows that share a prefix, in a causal
model) are interchangeable: the same logits give the same gradient through the same prefix,
so either assignment gives the same reference. A call whose rows are not found in any waiting
forward is not the job's LM loss (an auxiliary loss) and is left alone; a forward whose logits
no call used ends the job at the optimizer step with a message naming what was seen.

Not seen: a mask or weight applied after `reduction="none"` (every position the call did not
ignore counts as a target), label smoothing and class weights (refused by name: gradcert's
objective is the plain token cross entropy), a loss computed by another function
(`torch.nn.functional` imported by name before `import gradcert`, a fused kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


class Waiting:
    """A training forward without labels whose targets come from a later loss call."""

    def __init__(self, ids, attention_mask, position_ids, n_items):
        self.ids, self.attention_mask, self.position_ids, self.n_items = ids, attention_mask, position_ids, n_items
        self.logits = None  # [B, T, V], detached, set by the forward hook
        self.targets = None  # [B * T] long, IGNORE where no call made a target
        self.calls = []  # what each loss call that used these logits was: "cross_entropy(reduction='sum')"

    def resolved(self) -> bool:
        return self.targets is not None and bool((self.targets != IGNORE).any())


def _rows(inp: torch.Tensor, target: torch.Tensor):
    """The call's (input rows [M, V], targets [M]) whatever its layout ([M, V], [V], [B, V, d...])."""
    if inp.dim() == 1:
        return inp.unsqueeze(0), target.reshape(1)
    if inp.dim() == 2:
        return inp, target.reshape(-1)
    return inp.movedim(1, -1).reshape(-1, inp.size(1)), target.reshape(-1)


def _tolerance(dtype: torch.dtype, log_softmax: bool) -> float:
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return (64 if log_softmax else 2) * eps


def match_rows(rows: torch.Tensor, candidates: torch.Tensor, log_softmax: bool):
    """For each row of `rows` [M, V], the index of an equal row of `candidates` [P, V] (each
    candidate used once), or -1. Equal: bit for bit after casting the candidates to the rows'
    dtype, within that dtype's rounding for a log_softmax."""
    rows = rows.detach()
    cand = candidates.detach().to(rows.device, rows.dtype)
    if log_softmax:
        cand = F.log_softmax(cand.double(), dim=-1).to(rows.dtype)
    V = rows.size(-1)
    g = torch.Generator(device="cpu").manual_seed(20261207)
    r = torch.randn(V, generator=g, dtype=torch.float64).to(rows.device)
    pc = cand.double() @ r
    pr = rows.double() @ r
    spread = (cand.double().abs() @ r.abs()).clamp_min(1e-300)
    rt = _tolerance(rows.dtype, log_softmax)
    # the projections of equal rows differ only by the summation's rounding (float64, ~V eps)
    window = max(1e-9, 8 * rt) * float(spread.max())
    order = torch.argsort(pc)
    sorted_pc = pc[order]
    lo = torch.searchsorted(sorted_pc, pr - window).tolist()
    hi = torch.searchsorted(sorted_pc, pr + window, right=True).tolist()
    used = set()
    out = []
    for i in range(rows.size(0)):
        found = -1
        for k in range(lo[i], hi[i]):
            j = int(order[k])
            if j in used:
                continue
            a, b = rows[i].double(), cand[j].double()
            if rt == 0 or log_softmax:
                same = bool(((a - b).abs() <= rt * b.abs().clamp_min(1.0)).all())
            else:
                same = bool(torch.equal(a, b))
            if same:
                found = j
                break
        if found >= 0:
            used.add(found)
        out.append(found)
    return out


def assign(waiting: list, inp: torch.Tensor, target: torch.Tensor, *, ignore_index: int, kind: str, call: str):
    """Finds the forward (newest first) whose logits the call's non-ignored rows come from and
    writes their targets into it. Returns the forward, or None when the rows are not the
    logits of any waiting forward (the call is not the job's LM loss)."""
    if not torch.is_tensor(inp) or not torch.is_tensor(target) or target.dtype.is_floating_point:
        return None
    rows, tg = _rows(inp, target)
    keep = (tg != ignore_index).nonzero().reshape(-1)
    if keep.numel() == 0:
        return None
    rows, tg = rows.index_select(0, keep.to(rows.device)), tg.index_select(0, keep.to(tg.device)).to("cpu", torch.long)
    for w in reversed(waiting):
        if w.logits is None or w.logits.size(-1) != rows.size(-1):
            continue
        found = match_rows(rows, w.logits.reshape(-1, w.logits.size(-1)), log_softmax=(kind == "nll_loss"))
        hits = [j for j in found if j >= 0]
        if not hits:
            continue
        if len(hits) != len(found):
            missing = len(found) - len(hits)
            raise LookupError(f"{call}: {missing} of its {len(found)} target rows are not rows of the forward's logits "
                              f"(the others are): gradcert cannot tell which positions they target")
        if w.targets is None:
            w.targets = torch.full((w.logits.size(0) * w.logits.size(1),), IGNORE, dtype=torch.long)
        idx = torch.tensor(found, dtype=torch.long)
        if bool((w.targets[idx] != IGNORE).any()):
            raise LookupError(f"{call}: it targets positions that an earlier loss call on the same logits already "
                              f"targeted (the loss counted twice?)")
        w.targets[idx] = tg
        w.calls.append(call)
        return w
    return None


def call_text(kind: str, kwargs: dict) -> str:
    parts = [f"{k}={kwargs[k]!r}" for k in ("reduction", "ignore_index") if k in kwargs]
    return f"F.{kind}({', '.join(parts)})"


def refuse_options(kind: str, kwargs: dict):
    """Options that change the objective away from the plain token cross entropy: refused by name."""
    if kwargs.get("weight") is not None:
        return f"F.{kind}(weight=...): class weights change the objective gradcert certifies (plain token cross entropy)"
    if float(kwargs.get("label_smoothing", 0.0) or 0.0) > 0:
        return (f"F.{kind}(label_smoothing={kwargs['label_smoothing']}): label smoothing changes the objective gradcert "
                f"certifies (plain token cross entropy)")
    return None
