"""gradcert shim: Lightning `Trainer.fit()` with `DDPStrategy` (Gloo, CPU) under torchrun.

    torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
             --master_port=$GRADCERT_MASTER_PORT backends/python/stacks/lightning_ddp.py --config NAME

Lightning runs its own loop: it detects torchrun's environment (TorchElasticEnvironment),
wraps the LightningModule in DDP, replaces the DataLoader's SequentialSampler with a
`DistributedSampler(shuffle=True, seed=PL_GLOBAL_SEED or 0, drop_last=False)`
(`use_distributed_sampler=True`, the default: for the *training* loader Lightning 2.6 always
asks for shuffle=True, whatever sampler the user gave; trainer/connectors/data_connector.py
`_process_dataloader`), divides what training_step returns by `accumulate_grad_batches`, skips the DDP
all-reduce (no_sync) on accumulating microbatches, steps every A-th batch or at the last
batch of the epoch, and calls `optimizer.step(closure)`. The shim only:
  - gives it a dataset in the plan's order (common.global_order "samples": a
    shuffle=False sampler would hand example i to rank i mod W, which batches its own) with
    a SequentialSampler, batch_size = B_micro, common.collate; items {"input_ids", "labels"
    (gradcert's shifted labels), "sample_id"}. Lightning shuffles it anyway (above), so the
    windows hold other examples than the plan's; the sampler audit judges the ledger per
    epoch and the gradients on the ids the stack really consumed;
  - in training_step pops the sample ids (the model never sees them) and taps them with
    the logits;
  - observes the step: `on_before_optimizer_step` (after the closure's last backward and
    DDP's reduction, before clipping) reads the inner model's p.grad; the torch optimizer's
    step post hook reads the parameters. (common.Shim.attach's step *pre* hook cannot be
    used: Lightning runs training_step / backward inside `optimizer.step(closure)`, so the
    pre hook fires before the window's last microbatch.)
The model is the plan's (`--model`, e.g. gradcert.tiny_lm:tiny_lm),
loaded from initial.safetensors; `precision="64-true"` / `"32-true"` for float64 / float32
plans (bfloat16: exit 77).

Configurations (--config):
  default       what Lightning's docs show: training_step returns the microbatch's mean
                token cross-entropy; `Trainer(accelerator="cpu", devices=W,
                strategy=DDPStrategy(process_group_backend="gloo"), accumulate_grad_batches=A,
                precision=..., max_epochs=epochs, gradient_clip_val=None)`, no logger, no
                checkpointing.
  token-global  NOT a documented Lightning recipe: Lightning 2.6 documents none (its
                "Accumulate Gradients" docs only say each device accumulates independently
                and syncs before optimizer.step(); the token-level problem is open as
                Lightning-AI/pytorch-lightning issue #20350). The shim implements the
                token-global normalisation inside training_step: at the first microbatch of
                each window, the window's local valid-target count (counted on this rank's
                batches by a pre-pass over the very DataLoader Lightning built, at
                on_train_epoch_start) is summed across ranks with Lightning's own
                `strategy.reduce(..., reduce_op="sum")`, and training_step returns
                sum CE * accumulate_grad_batches * W / N (Lightning divides by A, DDP
                averages over W).

Facts (lightning 2.6.6, torch 2.13.0 CPU): the training sampler is shuffled (seed 0)
although the user passed a SequentialSampler; a partial final window is stepped (at the
epoch's last batch) but, in the default config, still divided by the nominal A;
DistributedSampler pads a dataset that does not divide by W with repeats of its first
(shuffled) examples (a batch.sample_ledger finding under --sampler-audit; none with the
default spec's 26 examples on 2 ranks: 13 each, 7 batches, windows of 3, 3, 1 batches,
the last one example per rank).
"""

import argparse
import os
import sys

import common  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import lightning  # noqa: E402
    import lightning.pytorch as pl  # noqa: E402
    from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
except Exception as e:  # pragma: no cover - environment problem
    common.skip(f"lightning cannot be imported: {e}")

CONFIGS = ("default", "token-global")
PRECISION = {torch.float64: "64-true", torch.float32: "32-true"}


def logits_of(out):
    return out.logits if hasattr(out, "logits") else out


class PlanModule(pl.LightningModule):
    """The user's LightningModule: the plan's model, its loss, the plan's optimizer."""

    def __init__(self, inner, shim, config):
        super().__init__()
        self.model = inner
        self.shim, self.config = shim, config
        self.ign = shim.data.ignore_index
        self.counts = None  # token-global: this rank's valid targets per batch of the epoch
        self.window_N = None
        self.facts = []

    # --- what gradcert observes (no math) ---------------------------------------------
    def grads(self):
        return {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in self.model.named_parameters()}

    def params(self):
        return {n: p for n, p in self.model.named_parameters()}

    def on_before_optimizer_step(self, optimizer):
        self.shim.before_step(self.grads())

    # --- the user's code ----------------------------------------------------------------
    def on_train_epoch_start(self):
        dl = self.trainer.train_dataloader
        if not self.facts:
            s = getattr(dl, "sampler", None)
            self.facts.append(f"sampler={type(s).__name__}(shuffle={getattr(s, 'shuffle', None)}, "
                              f"drop_last={getattr(s, 'drop_last', None)}, "
                              f"num_samples={getattr(s, 'num_samples', None)} per rank)")
        if self.config != "token-global":
            return
        self.counts = [int(b["labels"].ne(self.ign).sum()) for b in dl]
        if len(self.counts) != self.trainer.num_training_batches:
            common.fail(f"pre-pass saw {len(self.counts)} batches, the Trainer runs "
                        f"{self.trainer.num_training_batches}")

    def training_step(self, batch, batch_idx):
        ids = batch.pop("sample_id")
        labels = batch["labels"]
        logits = logits_of(self.model(batch["input_ids"]))
        self.shim.tap(ids, logits, labels)
        flat_logits, flat_labels = logits.flatten(0, 1), labels.flatten()
        if self.config == "default":
            loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=self.ign)
        else:
            A = self.trainer.accumulate_grad_batches
            if batch_idx % A == 0:
                k = batch_idx // A
                local = torch.tensor(sum(self.counts[k * A:(k + 1) * A]), dtype=torch.long)
                self.window_N = int(self.trainer.strategy.reduce(local, reduce_op="sum").item())
                self.shim.saw_window_count(self.window_N)
            S = F.cross_entropy(flat_logits, flat_labels, ignore_index=self.ign, reduction="sum")
            loss = S * A * self.trainer.world_size / self.window_N
        self.shim.add_stack_loss(loss)
        return loss

    def configure_optimizers(self):
        opt = common.optimizer_for(self.model.parameters(), self.shim.plan)
        opt.register_step_post_hook(lambda *_: self.shim.after_step(self.params()))
        return opt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=CONFIGS, default="default")
    args = ap.parse_args()
    shim = common.Shim("lightning-ddp", args.config, packages=("lightning", "torch"))
    shim.replicated = True  # DDP: every rank holds the whole model (replicas.agree)
    plan, data = shim.plan, shim.data
    if plan.dtype not in PRECISION:
        common.skip(f"the Lightning shim runs float64 / float32 plans, not {plan.dtype_name}")
    dataset, epochs = common.epoch_dataset(plan, data, "samples", "shifted", "Lightning DDP")
    loader = torch.utils.data.DataLoader(dataset, batch_size=plan.micro,
                                         sampler=torch.utils.data.SequentialSampler(dataset),
                                         collate_fn=common.collate(data.pad_token, data.ignore_index),
                                         drop_last=False, num_workers=0)

    torch.manual_seed(int(plan.spec.get("seed", 0)))
    inner = shim.build_model()
    module = PlanModule(inner, shim, args.config)
    timeout = int(float(plan.spec.get("timeout", {}).get("collective_s", 60)) or 60)
    from datetime import timedelta

    trainer = pl.Trainer(accelerator="cpu", devices=shim.world, num_nodes=1,
                         strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=timeout)),
                         accumulate_grad_batches=plan.accum, precision=PRECISION[plan.dtype], max_epochs=epochs,
                         gradient_clip_val=plan.max_grad_norm or None, gradient_clip_algorithm="norm",
                         use_distributed_sampler=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=os.path.join(shim.run.out, "lightning-out"))
    trainer.fit(module, train_dataloaders=loader)

    env = type(trainer.strategy.cluster_environment).__name__
    facts = [f"Trainer.fit() of lightning {lightning.__version__}, config {args.config}",
             f"strategy={type(trainer.strategy).__name__}(gloo), cluster_environment={env}",
             f"precision={PRECISION[plan.dtype]}, accumulate_grad_batches={plan.accum}, "
             f"{trainer.num_training_batches} batches per rank per epoch"]
    facts += module.facts
    if args.config == "default":
        facts.append("training_step returns the microbatch's mean CE; Lightning divides by the nominal A "
                     "(partial final window stepped at the epoch's last batch); DDP averages over W")
    else:
        facts.append("NOT a documented Lightning recipe: token-global normalisation inside training_step "
                     "(sum CE * A * W / strategy.reduce(window count, 'sum'))")
    shim.finish(module.params, notes="; ".join(facts))
    common.shutdown()


if __name__ == "__main__":
    main()
