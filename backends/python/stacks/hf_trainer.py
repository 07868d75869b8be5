"""gradcert shim: Hugging Face transformers `Trainer.train()` under torchrun (Gloo, CPU).

    torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
             --master_port=$GRADCERT_MASTER_PORT backends/python/stacks/hf_trainer.py --config NAME

The Trainer runs its own loop (its dataloader through accelerate, its loss normalisation,
its gradient accumulation, its DDP wrapping, its optimizer step). The shim only:
  - gives it a dataset in the plan's order (common.global_order "batches": accelerate hands
    global batch j to rank j mod W) with a sequential sampler (`_get_train_sampler`), items
    {"input_ids", "labels" (NOTE [HF labels]), "sample_id"} (`remove_unused_columns=False`),
  - passes the plan's optimizer (torch SGD / AdamW) with a constant schedule, no warmup,
    `max_grad_norm` = the plan's (0: no clipping),
  - observes: `training_step` pops the sample ids (the model never sees them) and records
    `num_items_in_batch` (the N the Trainer normalises by, where it has one); a forward hook
    reads the logits; the torch optimizer's step pre / post hooks read the reduced gradient
    and the parameters.
The model is the plan's (`--model`, e.g. backends/python/stacks/models.py:gpt2_tiny): an HF
causal LM that computes its own loss from `labels` (what `Trainer(model, args, dataset)`
users get).

Configurations (--config):
  default       the Trainer's defaults: the model's own loss from labels; whatever
                `average_tokens_across_devices` defaults to in this version (4.46: False,
                5.x: True; 4.45 has no num_items_in_batch at all).
  token-global  the documented token-level recipe (4.46+): `average_tokens_across_devices=True`
                and a `compute_loss_func` = sum of token losses / num_items_in_batch (in the
                model's dtype); the model is wrapped to accept `**loss_kwargs` (what 4.46's
                Trainer requires to count tokens). 4.45 has no such recipe: the shim skips (77).
  local-tokens  5.x only: `average_tokens_across_devices=False` (each rank's own count).
  loss-kwargs   4.46+: the model follows the `**loss_kwargs` contract of 4.46's Llama-style
                models (forward(input_ids, labels, **loss_kwargs) -> the model's own
                `loss_function` = ForCausalLMLoss with num_items_in_batch), the Trainer's
                other settings at their defaults. GPT-2 itself takes no loss kwargs in 4.46.
"""

import argparse
import inspect
import os
import sys

import common  # noqa: E402
import torch  # noqa: E402

try:
    import transformers  # noqa: E402
    from transformers import Trainer, TrainingArguments  # noqa: E402
except Exception as e:  # pragma: no cover - environment problem
    common.skip(f"transformers cannot be imported: {e}")

CONFIGS = ("default", "token-global", "local-tokens", "loss-kwargs")
VERSION = tuple(int(x) for x in transformers.__version__.split(".")[:2])


class LossKwargs(torch.nn.Module):
    """The token-global recipe's model: forward(input_ids, labels=None, **loss_kwargs) ->
    the inner model's outputs (the loss is compute_loss_func's). 4.46's Trainer counts
    tokens only for a model whose forward takes `**loss_kwargs`."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids=None, labels=None, **loss_kwargs):
        return self.inner(input_ids=input_ids)


class OwnLossKwargs(torch.nn.Module):
    """The loss-kwargs config's model: what a 4.46 LlamaForCausalLM-style forward does, around
    the plan's HF model: logits, then the model's own `loss_function` (ForCausalLMLoss, which
    shifts the labels and upcasts the logits to float32) with the Trainer's num_items_in_batch."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids=None, labels=None, **loss_kwargs):
        out = self.inner(input_ids=input_ids)
        loss = None
        if labels is not None:
            loss = self.inner.loss_function(out.logits, labels, vocab_size=self.inner.config.vocab_size, **loss_kwargs)
        return {"loss": loss, "logits": out.logits}


def token_loss(ignore_index):
    """compute_loss_func: sum of token cross-entropies over shifted labels / num_items_in_batch
    (in the logits' dtype; HF's own ForCausalLMLoss upcasts to float32)."""

    def fn(outputs, labels, num_items_in_batch=None):
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs.logits
        shifted = common.shift_hf_labels(labels, ignore_index)
        S = common.loss_sum(logits, shifted, ignore_index)
        if num_items_in_batch is None:
            n = (shifted != ignore_index).sum()
            return S / n
        return S / (num_items_in_batch.to(S.dtype) if torch.is_tensor(num_items_in_batch) else num_items_in_batch)

    return fn


class EpochOrder(torch.utils.data.Sampler):
    """Sequential over the dataset, the same order every epoch (the plan's order)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=CONFIGS, default="default")
    args = ap.parse_args()
    if args.config == "token-global" and VERSION < (4, 46):
        common.skip(f"transformers {transformers.__version__} has no compute_loss_func / num_items_in_batch: "
                    f"no token-global recipe to run")
    if args.config in ("local-tokens", "loss-kwargs") and VERSION < (4, 46):
        common.skip(f"transformers {transformers.__version__} has no average_tokens_across_devices / loss_kwargs")
    shim = common.Shim("hf-trainer", args.config, packages=("transformers", "accelerate", "torch"))
    shim.replicated = True  # DDP: every rank holds the whole model (replicas.agree)
    plan, data = shim.plan, shim.data
    dataset, epochs = common.epoch_dataset(plan, data, "batches", "hf", "HF Trainer")

    torch.manual_seed(int(plan.spec.get("seed", 0)))
    inner = shim.build_model()
    if not hasattr(inner, "config"):
        common.fail("the HF Trainer shim needs a Hugging Face causal LM (forward(input_ids, labels) -> .loss); "
                    "run with --model backends/python/stacks/models.py:gpt2_tiny or your own HF model")
    model = LossKwargs(inner) if args.config == "token-global" else OwnLossKwargs(inner) \
        if args.config == "loss-kwargs" else inner
    optimizer = common.optimizer_for(inner.parameters(), plan)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    timeout = int(float(plan.spec.get("timeout", {}).get("collective_s", 60)) or 60)

    kw = dict(output_dir=os.path.join(shim.run.out, "hf-trainer-out"), per_device_train_batch_size=plan.micro,
              gradient_accumulation_steps=plan.accum, num_train_epochs=epochs, max_steps=-1,
              learning_rate=float(plan.optimizer["lr"]), lr_scheduler_type="constant", warmup_steps=0,
              max_grad_norm=plan.max_grad_norm, use_cpu=True, ddp_backend="gloo", report_to=[],
              save_strategy="no", logging_strategy="no", disable_tqdm=True, remove_unused_columns=False,
              dataloader_drop_last=False, dataloader_num_workers=0, seed=int(plan.spec.get("seed", 0)),
              ddp_find_unused_parameters=False, ddp_timeout=timeout)
    if args.config in ("token-global", "local-tokens"):
        kw["average_tokens_across_devices"] = args.config == "token-global"
    targs = TrainingArguments(**kw)

    class ObservedTrainer(Trainer):
        def _get_train_sampler(self, *a, **k):
            return EpochOrder(len(dataset))

        def training_step(self, model, inputs, *rest, **kwrest):
            ids = inputs.pop("sample_id")
            shim.pending_labels = inputs["labels"]
            shim.pending_ids = ids
            n = rest[0] if rest else kwrest.get("num_items_in_batch")
            shim.saw_window_count(n)
            loss = super().training_step(model, inputs, *rest, **kwrest)
            shim.add_stack_loss(loss)
            return loss

    def on_forward(module, inp, out):
        if not module.training or getattr(shim, "pending_ids", None) is None:
            return
        logits = out["logits"] if isinstance(out, dict) else out.logits
        shim.tap(shim.pending_ids, logits, common.shift_hf_labels(shim.pending_labels, data.ignore_index))
        shim.pending_ids = None

    inner.register_forward_hook(on_forward)
    names = [n for n, _ in inner.named_parameters()]

    def grads():
        return {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in inner.named_parameters()}

    def params():
        return {n: p for n, p in inner.named_parameters()}

    shim.attach(optimizer, grads, params)
    tkw = dict(model=model, args=targs, train_dataset=dataset,
               data_collator=common.collate(data.pad_token, data.ignore_index), optimizers=(optimizer, schedule))
    if args.config == "token-global":
        tkw["compute_loss_func"] = token_loss(data.ignore_index)
    trainer = ObservedTrainer(**tkw)
    trainer.train()

    facts = [f"Trainer.train() of transformers {transformers.__version__}, config {args.config}",
             f"average_tokens_across_devices={getattr(targs, 'average_tokens_across_devices', 'n/a')}",
             f"model_accepts_loss_kwargs={getattr(trainer, 'model_accepts_loss_kwargs', 'n/a')}",
             "compute_loss_func" if args.config == "token-global" else
             "the model's own loss_function via **loss_kwargs (ForCausalLMLoss, float32 logits)"
             if args.config == "loss-kwargs" else "the model's own loss from labels",
             f"{len(names)} parameters"]
    sig = inspect.signature(Trainer.training_step).parameters
    if "num_items_in_batch" not in sig:
        facts.append("no num_items_in_batch in this version (per-microbatch mean / A)")
    shim.finish(params, notes="; ".join(facts))
    common.shutdown()


if __name__ == "__main__":
    main()
