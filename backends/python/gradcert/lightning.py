"""gradcert for Lightning: `L.Trainer(..., callbacks=[gradcert.lightning.Callback()])`.

At `on_train_start` (the strategy set up, the optimizer built, the data loader made, no step
taken) the callback starts `gradcert.watch` on the module that receives the inputs and on the
Trainer's optimizer, with the job's own batch settings: the loader's batch_size x
accumulate_grad_batches x world_size is what batch.update_size holds it to, and the loader's
length per rank gives the epoch's windows. Lightning runs training_step and backward inside
`optimizer.step(closure)`, so the optimizer's step pre-hook fires before the window's last
backward: the callback takes the gradient at `on_before_optimizer_step` instead (after the
closure, before Lightning's gradient clipping). Outside `gradcert observe` it does nothing.

Which module is watched: `Callback(model="model")` names an attribute of the LightningModule
(or pass a callable, pl_module -> nn.Module); by default the LightningModule itself when it
defines `forward`, else its one child that holds every trainable parameter (the usual
`self.model = ...`). Its forward must receive the inputs and the labels (HF `labels=`, or
`targets=` / a second argument already shifted); `factory` rebuilds it for the reference when
it is not a Hugging Face model.
"""

from __future__ import annotations


import torch.nn as nn

from . import observe
from ._observe_facts import loader_facts

try:
    from lightning.pytorch.callbacks import Callback as _Base
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback as _Base


def _watched_module(pl_module: nn.Module, model) -> nn.Module:
    if callable(model) and not isinstance(model, nn.Module):
        return model(pl_module)
    if isinstance(model, str):
        m = getattr(pl_module, model, None)
        if not isinstance(m, nn.Module):
            observe._fail_early(f"gradcert.lightning.Callback(model={model!r}): the LightningModule has no "
                                f"nn.Module attribute {model!r}")
        return m
    if isinstance(model, nn.Module):
        return model
    if "forward" in type(pl_module).__dict__:
        return pl_module
    trainable = {id(p) for p in pl_module.parameters() if p.requires_grad}
    for _, child in pl_module.named_children():
        if trainable and trainable <= {id(p) for p in child.parameters()}:
            return child
    observe._fail_early("gradcert.lightning.Callback: the LightningModule defines no forward and no one child "
                        "holds all its trainable parameters; name the module the inputs go to: "
                        "Callback(model='attribute')")


class Callback(_Base):
    """Records the Lightning job for `gradcert observe` (a no-op outside it)."""

    def __init__(self, model=None, factory=None, labels=None):
        super().__init__()
        self.model, self.factory, self.labels = model, factory, labels
        self.observer = observe.NoOp()

    def on_train_start(self, trainer, pl_module):
        if not observe.observing() or self.observer:
            return
        if len(trainer.optimizers) != 1:
            observe._fail_early(f"gradcert.lightning.Callback: the job has {len(trainer.optimizers)} optimizers; "
                                f"gradcert observe certifies one")
        accum = int(trainer.accumulate_grad_batches)
        loader = trainer.train_dataloader
        job = loader_facts(loader, accum)  # micro, B_update, dataset size, windows per epoch, drop_last
        job.update(source="Lightning Trainer", max_grad_norm=float(trainer.gradient_clip_val or 0.0),
                   precision=str(getattr(trainer.precision_plugin, "precision", trainer.precision)))
        sampler = getattr(loader, "sampler", None)
        if sampler is not None:
            job["sampler"] = type(sampler).__name__
            if hasattr(sampler, "drop_last"):
                job["drop_last"] = bool(sampler.drop_last)
        self.observer = observe.watch(_watched_module(pl_module, self.model), trainer.optimizers[0],
                                      factory=self.factory, labels=self.labels, integration="lightning", job=job)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.observer.capture_grads()
