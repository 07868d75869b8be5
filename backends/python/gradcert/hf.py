"""gradcert for Hugging Face transformers: `Trainer(..., callbacks=[gradcert.hf.Callback()])`.

At `on_train_begin` (the model wrapped, the optimizer and schedule created, no step taken)
the callback starts `gradcert.watch` on the Trainer's model and optimizer, with the job's
own batch settings from its TrainingArguments (per_device_train_batch_size x
gradient_accumulation_steps x world_size is what batch.update_size holds it to). The
Trainer's loop is untouched: its collator, sampler, loss (and `num_items_in_batch`),
accumulation, clipping (`max_grad_norm`, recorded before it clips), schedule and optimizer
are what gradcert certifies. Outside `gradcert observe` it does nothing.

`from_saved` rebuilds the job's model for the reference runner from the config the
recorder saved (observed.model.json: class, config with dropout off, attention kernel).
"""

from __future__ import annotations

import importlib
import json
import math

from transformers import TrainerCallback

from . import observe


class Callback(TrainerCallback):
    """Records the Trainer's job for `gradcert observe` (a no-op outside it)."""

    def __init__(self, factory=None):
        self.factory = factory
        self.observer = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if not observe.observing() or self.observer is not None:
            return
        if model is None or optimizer is None:
            observe._fail_early("gradcert.hf.Callback: the Trainer passed no model or optimizer to on_train_begin")
        world = int(getattr(args, "world_size", 1) or 1)
        micro, accum = int(args.per_device_train_batch_size), int(args.gradient_accumulation_steps)
        job = {"source": "TrainingArguments", "micro": micro, "accum": accum, "expect_batch": micro * accum * world,
               "max_grad_norm": float(args.max_grad_norm or 0.0),
               "average_tokens_across_devices": getattr(args, "average_tokens_across_devices", None),
               "optim": str(getattr(args, "optim", "")), "lr_scheduler_type": str(args.lr_scheduler_type),
               "drop_last": bool(args.dataloader_drop_last)}
        loader = kwargs.get("train_dataloader")
        try:  # the epoch's windows as the Trainer counts them: ceil(batches per rank / A)
            job["dataset_size"] = len(loader.dataset)
            job["windows_per_epoch"] = math.ceil(len(loader) / accum)
        except (TypeError, AttributeError):
            pass
        self.observer = observe.watch(model, optimizer, factory=self.factory, labels="hf", integration="hf-trainer",
                                      job=job)


def from_saved(path: str):
    """The model of observed.model.json: its class built from its config (no weights: the
    reference loads initial.safetensors), dropout off, the job's attention kernel; a PEFT
    model's adapters put back on it ("peft": the wrapper, every adapter's config)."""
    with open(path) as f:
        saved = json.load(f)
    module, _, name = saved["class"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    config = cls.config_class.from_dict(dict(saved["config"]))
    kw = {}
    if saved.get("attn_implementation"):
        kw["attn_implementation"] = saved["attn_implementation"]
    model = cls._from_config(config, **kw)
    if saved.get("loss_type") is not None:
        model.loss_type = saved["loss_type"]
    if saved.get("peft"):
        model = _with_adapters(model, saved["peft"])
    observe.turn_off_dropout(model, keep=False)
    return model


def _with_adapters(base, facts: dict):
    """get_peft_model on the rebuilt base with the job's adapter configs (active one first)."""
    from peft import PeftConfig, get_peft_model

    adapters = facts["adapters"]
    active = facts["active_adapter"] if facts.get("active_adapter") in adapters else next(iter(adapters))
    model = get_peft_model(base, PeftConfig.from_peft_type(**adapters[active]), adapter_name=active)
    for name, d in adapters.items():
        if name != active:
            model.add_adapter(name, PeftConfig.from_peft_type(**d))
    model.set_adapter(active)
    if observe.qualified(model) != facts["wrapper"]:
        raise RuntimeError(f"gradcert.hf: rebuilt {observe.qualified(model)}, the job trained {facts['wrapper']}")
    return model
