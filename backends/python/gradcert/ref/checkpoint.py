"""Checkpoints for resumed runs (backends/PROTOCOL.md "Checkpoints and resumed runs"): the
protocol's side, which any stack and gradcert.ref.dcp_export use.

Under `gradcert run --backend external --resume-at K` the stack's command runs twice. The
first time with GRADCERT_SAVE_AT=K and GRADCERT_SAVE_DIR: it trains updates 0..K-1 (their
artifacts as always), saves its state into GRADCERT_SAVE_DIR and exits. The second time
(possibly another world: GRADCERT_NPROC and the second leg's plan.json; possibly another
command: `--resume-command`) with GRADCERT_RESUME_FROM: it loads that state and trains updates
K..end, numbering them as the plan does.

The state is saved with torch.distributed.checkpoint (DCP): the model's and the optimizer's
state dicts as torch.distributed.checkpoint.state_dict gives them (canonical parameter names),
saved by every rank, plus gradcert.json (MANIFEST) from rank 0: the updates done, the
optimizer's step counter, the sampler position (the next window), the run's nonce. Here:
`Resume` (what the environment asks of a leg) and `read_manifest` (gradcert.json, checked).
The PyTorch adapters' own save and load legs, with the planted resume bugs, are the test
bed's (backends/python/testbed/checkpoint.py), not part of the installed package.

gradcert does not trust a stack's load: after the first leg, gradcert.ref.dcp_export reads
the files on disk into gradcert's own layout-independent form and resume.checkpoint judges
them; the checks after the resume judge the load.
"""

from __future__ import annotations

import json
import os

from .. import _env
from .client import ProtocolError

MANIFEST = "gradcert.json"
SCHEMA = "gradcert.stack-checkpoint/1"
FORMAT = "torch.distributed.checkpoint"


class Resume:
    """What the environment asks of this leg: save after `save_at` updates into `save_dir`,
    and / or start from the checkpoint in `resume_from`."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        self.save_at, self.save_dir = None, env.get(_env.SAVE_DIR) or None
        self.resume_from = env.get(_env.RESUME_FROM) or None
        if env.get(_env.SAVE_AT):
            try:
                self.save_at = int(env[_env.SAVE_AT])
            except ValueError:
                raise ProtocolError(f"{_env.SAVE_AT}={env[_env.SAVE_AT]!r}: expected an update count")
            if self.save_at < 1:
                raise ProtocolError(f"{_env.SAVE_AT}={self.save_at}: expected >= 1")
            if not self.save_dir:
                raise ProtocolError("GRADCERT_SAVE_AT is set but GRADCERT_SAVE_DIR is not")

    @property
    def active(self) -> bool:
        return self.save_at is not None or self.resume_from is not None

def read_manifest(path: str, nonce: str | None) -> dict:
    f = os.path.join(path, MANIFEST)
    try:
        with open(f) as fh:
            m = json.load(fh)
    except FileNotFoundError:
        raise ProtocolError(f"{f}: missing (rank 0 writes it after every rank saved)")
    except ValueError as e:
        raise ProtocolError(f"{f}: not JSON ({e})")
    if not isinstance(m, dict) or m.get("schema") != SCHEMA:
        raise ProtocolError(f"{f}: field 'schema' must be {SCHEMA!r}")
    for k in ("updates_done", "optimizer_step", "world"):
        if not isinstance(m.get(k), int) or isinstance(m.get(k), bool) or m[k] < 0:
            raise ProtocolError(f"{f}: field {k!r} must be a non-negative integer, got {m.get(k)!r}")
    s = m.get("sampler")
    if not isinstance(s, dict) or not all(isinstance(s.get(k), int) for k in ("epoch", "index_in_epoch")):
        raise ProtocolError(f"{f}: field 'sampler' must hold integers 'epoch' and 'index_in_epoch'")
    if nonce is not None and m.get("nonce") != nonce:
        raise ProtocolError(f"{f}: nonce {m.get('nonce')!r} is not this run's (GRADCERT_RUN_NONCE={nonce}): a "
                            "checkpoint of another run?")
    return m
