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

from .observe import NoOp, ObserveError, install_loss_wrapper, observing, watch

if observing():  # before the job can import cross_entropy by name (NOTE [loss outside the model])
    install_loss_wrapper()

__version__ = "0.11.0"
__all__ = ["watch", "observing", "NoOp", "ObserveError", "hf", "lightning"]


def __getattr__(name):
    # gradcert.hf / gradcert.lightning import their framework: only on use.
    if name in ("hf", "lightning"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'gradcert' has no attribute {name!r}")
