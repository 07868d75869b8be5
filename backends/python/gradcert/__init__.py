"""gradcert: certify your own training job against a one-process float64 reference.

Add one line to the training script and run it under `gradcert observe`:

    import gradcert
    gradcert.watch(model, optimizer, factory=build, loader=loader, accum=A)
                                                  # plain PyTorch, DDP, FSDP1/2, accelerate
    Trainer(..., callbacks=[gradcert.hf.Callback()])                       # HF Trainer
    L.Trainer(..., callbacks=[gradcert.lightning.Callback(factory=build)])  # Lightning

    gradcert observe --out DIR -- torchrun --nproc_per_node 2 train.py ...

Outside `gradcert observe` every integration does nothing, so it can stay in the script.
`gradcert.ref` is the protocol client and the reference runner; `gradcert.tiny_lm` the
built-in model (`gradcert.tiny_lm:tiny_lm`). The PyTorch adapters' trainer, their planted
bugs and the bug catalog are the test bed (backends/python/testbed/), not installed.
"""

import os as _os

#: The environment variable `gradcert observe` sets for its job (gradcert.observe reads it too).
from ._env import OBSERVE_DIR as ENV_DIR  # noqa: E402


def observing() -> bool:
    """Whether this process runs under `gradcert observe` (torch is not imported for this)."""
    return bool(_os.environ.get(ENV_DIR))


if observing():  # before the job can import cross_entropy by name (NOTE [loss outside the model])
    from .observe import install_loss_wrapper

    install_loss_wrapper()


def _version() -> str:
    """The one version number (pyproject.toml's), as installed."""
    from importlib import metadata

    try:
        return metadata.version("gradcert")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


__version__ = _version()
__all__ = ["watch", "observing", "NoOp", "ObserveError", "hf", "lightning"]


def __getattr__(name):
    # torch, and gradcert.hf / gradcert.lightning's frameworks, are imported on first use only:
    # `gradcert` / `python -m gradcert` (gradcert/__main__.py) start without them.
    import importlib

    if name in ("watch", "NoOp", "ObserveError", "install_loss_wrapper"):
        return getattr(importlib.import_module(".observe", __name__), name)
    if name in ("hf", "lightning", "observe", "ref", "tiny_lm"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'gradcert' has no attribute {name!r}")
