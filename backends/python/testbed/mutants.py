"""The adapters' planted bugs (`--mutant ID`), and the objectives they stand for: part of the
test bed (backends/python/testbed/), not of the installed `gradcert` package.

Every adapter's wrapper averages gradients over the D data-parallel ranks and sums them
over the A microsteps of a window, so what it finally holds is

    g = (1/D) * sum_{r,a} scale_{r,a} * grad S_{r,a}

where `scale_{r,a}` multiplies the loss sum S_{r,a} of DP rank r at microstep a before
backward. The correct rule is scale = D / N (N: valid targets of the whole window), which
gives grad(sum S / N). Each mutant changes `scale` (or N, or skips the window); the same
function gives the coefficient `scale / D` of each piece gradient, so a diagnosis can
rebuild what a stack computed from the reference's pieces (`coefficients`).

Ids (spelled as gradcert's C++ mutants):

- `local-mean`: each rank normalises by its own valid targets n_r, then ranks are
  averaged: scale = 1 / n_r (0 on a rank without targets).
- `micro-mean`: each microbatch's token mean, then divided by A:
  scale = 1 / (n_{r,a} * A) (0 for a microbatch without targets), in every window.
- `partial-nominal-accum`: full windows are correct (D / N). In a *partial* final window
  the stack switches to the per-microbatch mean divided by the *nominal* A, although
  fewer microbatches carry data there: scale = 1 / (n_{r,a} * A) with A the spec's
  accumulation steps, empty microbatches contributing nothing. (The HF-style "divide by
  gradient_accumulation_steps in the last, short accumulation" bug.)
- `unshifted-count`: N counted on unshifted labels: every row (example) with at least
  one valid target counts one extra target (the label position that shifting drops), so
  N_u = N + rows_with_targets of the window, all ranks; scale = D / N_u. The stack also
  reports N_u as the N it used and S / N_u as its loss, and n_r + rows as its own count.
- `drop-partial-window`: the partial final window is skipped: no forward, no backward,
  no optimizer step (its examples are not consumed). Artifacts for that update: the
  rank files report empty microbatches (consumed [] x A, loss_sum 0, valid_targets 0),
  the manifest reports loss 0 and N 0, the gradient artifact is all zeros and the
  parameters artifact holds the unchanged parameters (those after the previous update).
  Full windows are correct.
- `first-and-last-microsteps`: each window keeps only its first and its last microstep
  (the last that carries a target on any rank); the middle ones are scaled by 0, the kept ones
  by the correct D / N (DeepSpeed < 0.19 ZeRO-1/2 with offload_optimizer, #7967).
- `last-microstep-only`: each window keeps only its last microstep (DeepSpeed < 0.19 with
  offload_optimizer and several backward calls per step at ga_steps=1, #7981).
- `grad-scale-1.05`: a uniform 1.05x gradient scale: scale = 1.05 * D / N (as an
  unnoticed loss-scale factor would do); for the low-precision scale tests. The loss the
  stack reports stays S / N.

The checkpoint bugs (with `gradcert run --resume-at K`; testbed/checkpoint.py, as
gradcert's C++ mutants of the same names): `resume-optimizer-unsaved` (the checkpoint holds
the model only), `resume-step-reset` (the load leaves AdamW's step counters at 0),
`resume-sampler-restart` (the second leg starts update K's epoch over),
`resume-sampler-skip` (it starts the next epoch), `resume-shard-unwritten` (the last rank's
DCP files are not on disk after the save).
"""

from __future__ import annotations


def _catalog() -> list:
    """The one bug-class catalog (testbed/bugs.json, beside this file; C++ checks its tables
    against it)."""
    import json
    import os

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bugs.json")) as f:
        return json.load(f)["bugs"]


#: id -> what it plants: the catalog's classes that apply to the adapters, in its order.
MUTANTS = {b["name"]: b["what"] for b in _catalog() if "adapter" in b["applies"]}

RESUME_MUTANTS = tuple(m for m in MUTANTS if m.startswith("resume-"))

GRAD_SCALE = 1.05


class MutantError(ValueError):
    pass


def check(mutant: str | None):
    if mutant is not None and mutant not in MUTANTS:
        raise MutantError(f"unknown mutant {mutant!r} (known: {', '.join(MUTANTS)})")


def _inv(x: float) -> float:
    return 1.0 / x if x > 0 else 0.0


def drops_window(mutant: str | None, partial: bool) -> bool:
    return mutant == "drop-partial-window" and partial


def window_count(mutant: str | None, N: int, rows_with_targets: int) -> int:
    """The N the stack uses for the window (rows_with_targets: of the whole window)."""
    return N + rows_with_targets if mutant == "unshifted-count" else N


def rank_count(mutant: str | None, n_r: int, rows_r: int) -> int:
    """What the stack reports as this rank's own valid targets."""
    return n_r + rows_r if mutant == "unshifted-count" else n_r


def loss_scale(mutant: str | None, dp: int, accum: int, N_used: int, n_rank: int, n_micro: int,
               partial: bool, micro: int = 0, last_micro: int = 0) -> float:
    """What multiplies S_{r,a} before backward. N_used: window_count(...); micro: a;
    last_micro: the window's last microstep that carries a target on any rank."""
    check(mutant)
    if (mutant == "first-and-last-microsteps" and 0 < micro < last_micro) or \
            (mutant == "last-microstep-only" and micro != last_micro):
        return 0.0
    if mutant == "local-mean":
        return _inv(n_rank)
    if mutant == "micro-mean" or (mutant == "partial-nominal-accum" and partial):
        return _inv(n_micro * accum)
    if mutant == "drop-partial-window" and partial:
        return 0.0
    s = dp * _inv(N_used)
    return GRAD_SCALE * s if mutant == "grad-scale-1.05" else s


def coefficients(mutant: str | None, pieces: list, dp: int, accum: int, partial: bool) -> dict:
    """(dp_rank, micro) -> c such that the stack's gradient is sum c * grad S_{r,a}.
    `pieces`: the reference's sidecar entries (dp_rank, micro, valid_targets,
    rows_with_targets). mutant None: the correct objective (c = 1/N)."""
    N = sum(p["valid_targets"] for p in pieces)
    rows = sum(p["rows_with_targets"] for p in pieces)
    N_used = window_count(mutant, N, rows)
    n_rank = {}
    for p in pieces:
        n_rank[p["dp_rank"]] = n_rank.get(p["dp_rank"], 0) + p["valid_targets"]
    last = max((p["micro"] for p in pieces if p["rows_with_targets"] > 0), default=0)
    return {(p["dp_rank"], p["micro"]): loss_scale(mutant, dp, accum, N_used, n_rank[p["dp_rank"]],
                                                   p["valid_targets"], partial, p["micro"], last) / dp
            for p in pieces}

