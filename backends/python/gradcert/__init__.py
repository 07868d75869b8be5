"""gradcert: certify your own training job against a one-process float64 reference.

Add one line to the training script and run it under `gradcert observe`:

    import gradcert
    gradcert.watch(model, optimizer)                 # plain PyTorch, DDP, FSDP2, accelerate
    Trainer(..., callbacks=[gradcert.hf.Callback()])          # Hugging Face Trainer
    L.Trainer(..., callbacks=[gradcert.lightning.Callback()]) # Lightning

    gradcert observe --out DIR -- torchrun --nproc_per_node 2 train.py ...

Outside `gradcert observe` every integration does nothing, so it can stay in the script.
`gradcert.ref` is the protocol client and the reference runner; `gradcert.tiny_lm` the
built-in model the PyTorch adapters train.
"""

from .observe import NoOp, ObserveError, observing, watch

__version__ = "0.11.0"
__all__ = ["watch", "observing", "NoOp", "ObserveError", "hf", "lightning", "deepspeed"]


def __getattr__(name):
    # gradcert.hf / gradcert.lightning / gradcert.deepspeed import their framework: only on use.
    if name in ("hf", "lightning", "deepspeed"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'gradcert' has no attribute {name!r}")
