"""The job-wide hooks of `gradcert observe`'s recorder (gradcert.observe): torch's
clip_grad_norm_ wrapped (the gradient before clipping), F.cross_entropy / F.nll_loss wrapped
(the targets of a loss computed outside the model, NOTE [loss outside the model]) and the
excepthook that records a rank's own uncaught exception. Each is installed once per process and
serves every live recorder in OBSERVERS.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

from ._observe_facts import _local
from .ref import client

OBSERVERS: list = []  # the live recorders of this process (normally one)


# --------------------------------------------------------------------------------------
# clip_grad_norm_: the gradient before clipping
# --------------------------------------------------------------------------------------

_ORIGINAL_CLIP = None


def install_clip_wrapper():
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
        owners = [o for o in OBSERVERS if o.owns_any(params) and not o._ended]
        return _around_clip(owners, params, max_norm, lambda: original(params, max_norm, *args, **kwargs))

    clip_grad_norm_.__wrapped__ = original
    clip_grad_norm_.__doc__ = original.__doc__
    U.clip_grad_norm_ = clip_grad_norm_
    C.clip_grad_norm_ = clip_grad_norm_
    _wrap_fsdp1_clip()


def _around_clip(owners, params, max_norm, clip):
    """Each owner's gradient before the clip (its first clip of the window), the clip, then its max norm."""
    for o in owners:
        if o._pre_clip is None:
            o._pre_clip = o._read_grads()
    total = clip()
    for o in owners:
        o.saw_clip(params, max_norm, _local(total).item() if torch.is_tensor(total) else total)
    return total


def _wrap_fsdp1_clip():
    """FSDP1's own FullyShardedDataParallel.clip_grad_norm_ (the norm over every rank's shards),
    called on the root by every rank: the gradient before it is gathered there too."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:
        return
    original = FSDP.clip_grad_norm_

    def clip_grad_norm_(self, max_norm, *args, **kwargs):
        owners = [o for o in OBSERVERS if getattr(o, "fsdp1", None) is self and not o._ended]
        return _around_clip(owners, None, max_norm, lambda: original(self, max_norm, *args, **kwargs))

    clip_grad_norm_.__wrapped__ = original
    clip_grad_norm_.__doc__ = original.__doc__
    FSDP.clip_grad_norm_ = clip_grad_norm_


_PREVIOUS_EXCEPTHOOK = None


def install_excepthook():
    """A rank whose job dies of an uncaught exception writes observed.rank<g>.died.json (the
    exception line and the job's own innermost frame), so `gradcert observe` quotes each rank's
    own error rather than only the launcher's summary; then the job's previous hook runs."""
    global _PREVIOUS_EXCEPTHOOK
    if _PREVIOUS_EXCEPTHOOK is not None:
        return
    _PREVIOUS_EXCEPTHOOK = sys.excepthook

    def excepthook(kind, value, tb):
        try:
            import traceback

            frames = traceback.extract_tb(tb)
            own = [f for f in frames if "site-packages" not in f.filename and "dist-packages" not in f.filename]
            f = (own or frames or [None])[-1]
            where = f"File {f.filename}, line {f.lineno}, in {f.name}" if f is not None else ""
            line = "".join(traceback.format_exception_only(kind, value)).strip().splitlines()
            for o in OBSERVERS:
                client.write_json(os.path.join(o.out, f"observed.rank{o.rank}.died.json"),
                                  {"schema": "gradcert.observed-died/1", "rank": o.rank, "update": o.update,
                                   "nonce": o.nonce, "error": line[-1] if line else kind.__name__, "where": where})
        except Exception:
            pass
        _PREVIOUS_EXCEPTHOOK(kind, value, tb)

    sys.excepthook = excepthook


ORIGINAL_LOSSES: dict = {}


def install_loss_wrapper():
    """Wraps torch.nn.functional.cross_entropy and nll_loss (what nn.CrossEntropyLoss and
    nn.NLLLoss call) so that a job computing its loss outside the model shows its targets
    (NOTE [loss outside the model], gradcert/_loss_targets.py). Called at `import gradcert`
    under `gradcert observe` (before a job imports the functions by name) and at watch()."""
    import inspect

    for kind in ("cross_entropy", "nll_loss"):
        if kind in ORIGINAL_LOSSES:
            continue
        original = getattr(F, kind)
        signature = inspect.signature(original)

        def wrapper(*args, __kind=kind, __original=original, __signature=signature, **kwargs):
            waiting = [o for o in OBSERVERS if o._waiting]
            if waiting:
                try:
                    bound = __signature.bind(*args, **kwargs)
                except TypeError:
                    bound = None
                if bound is not None:
                    bound.apply_defaults()
                    a = dict(bound.arguments)
                    for o in waiting:
                        o.saw_loss(__kind, a.get("input"), a.get("target"), a)
            return __original(*args, **kwargs)

        wrapper.__wrapped__ = original
        wrapper.__doc__ = original.__doc__
        wrapper.__name__ = kind
        ORIGINAL_LOSSES[kind] = original
        setattr(F, kind, wrapper)
