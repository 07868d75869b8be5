"""gradcert shim: a Hugging Face accelerate training loop (`Accelerator`, prepared model /
optimizer / dataloader) under torchrun (Gloo, CPU).

    torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
             --master_port=$GRADCERT_MASTER_PORT backends/python/stacks/accelerate_loop.py --config NAME

accelerate has no trainer: its "training code path" is the loop its docs tell users to
write around its primitives. The shim writes exactly that loop (one per config, as the
docs show it) and lets accelerate do the rest: `Accelerator(gradient_accumulation_steps=A,
cpu=True)` picks the process group (MULTI_CPU, gloo) from torchrun's environment,
`prepare()` wraps the model in DDP, the optimizer in AcceleratedOptimizer and the loader in
a DataLoaderShard (BatchSamplerShard: global batch j -> rank j mod W, `even_batches=True`
by default), `accelerator.backward()` divides the loss by A, and AcceleratedOptimizer
steps / zeroes only where `sync_gradients` is True. The shim only:
  - gives it a dataset in the plan's order (common.global_order "batches") with a
    SequentialSampler, batch_size = B_micro, common.collate; items {"input_ids", "labels"
    (gradcert's shifted labels: labels[t] is the target of position t), "sample_id"};
  - pops the sample ids from each batch before the model, and taps them with the logits;
  - observes the step on the torch optimizer inside AcceleratedOptimizer (step pre / post
    hooks): the inner module's p.grad (DDP-reduced) just before, the parameters just after.
The model is the plan's (`--model`, e.g. gradcert.tiny_lm:tiny_lm,
forward(input_ids) -> logits), loaded from initial.safetensors in the plan's dtype.

Configurations (--config):
  default       the docs' "gradient accumulation" loop: `with accelerator.accumulate(model):
                loss = mean token CE of the microbatch; accelerator.backward(loss);
                optimizer.step(); optimizer.zero_grad()`. accumulate() syncs every A-th
                microbatch or at the end of the dataloader (sync_with_dataloader), so a
                partial final window is stepped, still divided by the nominal A.
  token-global  the documented token-level recipe: accelerate docs, usage guide "Gradient
                accumulation" (accelerate/docs/source/usage_guides/gradient_accumulation.md), section
                "Gradient accumulation on training samples of variable size", skeleton code
                (also accelerate/examples/by_feature/gradient_accumulation_for_autoregressive_models.py):
                pre-load the window's local batches (A, or len(dataloader) % A for the last
                window of the epoch), num_items_in_batch = accelerator.gather(local count of
                labels != -100).sum(), per batch `loss = sum CE * gradient_accumulation_steps *
                num_processes / num_items_in_batch`, `model.no_sync` on all but the last
                batch, accelerator.backward(loss), then optimizer.step(); optimizer.zero_grad()
                (no accumulate() context). Our labels are already shifted, so the count is of
                the labels themselves (the docs' `labels[..., 1:]` is for HF models that shift
                internally).

Facts (accelerate 1.15.0, torch 2.13.0 CPU): `even_batches=True` by default: when the
number of global batches does not divide by W, the ranks short of a batch get one made of
examples from the start of the dataset (duplicates: a batch.sample_ledger finding, named
by gradcert under --sampler-audit). bfloat16 plans are not run here (exit 77).
"""

import argparse
import contextlib
import math
import os
import sys

import common  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import accelerate  # noqa: E402
    from accelerate import Accelerator  # noqa: E402
except Exception as e:  # pragma: no cover - environment problem
    common.skip(f"accelerate cannot be imported: {e}")

CONFIGS = ("default", "token-global")


def logits_of(out):
    return out.logits if hasattr(out, "logits") else out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=CONFIGS, default="default")
    args = ap.parse_args()
    shim = common.Shim("accelerate", args.config, packages=("accelerate", "torch"))
    shim.replicated = True  # DDP: every rank holds the whole model (replicas.agree)
    plan, data = shim.plan, shim.data
    if plan.dtype == torch.bfloat16:
        common.skip("the accelerate shim runs float64 / float32 plans (bf16 needs mixed_precision masters)")
    if plan.max_grad_norm > 0:
        common.fail("the accelerate shim does not clip (the docs' loop would call accelerator.clip_grad_norm_); "
                    "run a plan without optimizer.max_grad_norm")
    dataset, epochs = common.epoch_dataset(plan, data, "batches", "shifted", "accelerate")
    ign = data.ignore_index
    A = plan.accum

    accelerator = Accelerator(gradient_accumulation_steps=A, cpu=True)
    if accelerator.num_processes != shim.world:
        common.fail(f"accelerate sees {accelerator.num_processes} processes, torchrun started {shim.world}")

    torch.manual_seed(int(plan.spec.get("seed", 0)))
    inner = shim.build_model()
    optimizer = common.optimizer_for(inner.parameters(), plan)
    loader = torch.utils.data.DataLoader(dataset, batch_size=plan.micro,
                                         sampler=torch.utils.data.SequentialSampler(dataset),
                                         collate_fn=common.collate(data.pad_token, ign), drop_last=False)
    model, optimizer, loader = accelerator.prepare(inner, optimizer, loader)
    base = accelerator.unwrap_model(model)
    torch_opt = optimizer.optimizer  # the torch optimizer AcceleratedOptimizer steps

    def grads():
        return {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in base.named_parameters()}

    def params():
        return {n: p for n, p in base.named_parameters()}

    shim.attach(torch_opt, grads, params)
    even = getattr(getattr(loader, "batch_sampler", None), "even_batches", None)

    def forward(batch):
        ids = batch.pop("sample_id")
        labels = batch["labels"]
        logits = logits_of(model(batch["input_ids"]))
        shim.tap(ids, logits, labels)
        return logits, labels

    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        if args.config == "default":
            # accelerate docs, usage guide "Gradient accumulation": the accumulate() loop.
            for batch in loader:
                with accelerator.accumulate(model):
                    logits, labels = forward(batch)
                    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=ign)
                    accelerator.backward(loss)
                    shim.add_stack_loss(loss)
                    optimizer.step()
                    optimizer.zero_grad()
        else:
            # accelerate docs, "Gradient accumulation on training samples of variable size".
            it = iter(loader)
            nb = len(loader)
            remainder = nb % A
            remainder = remainder if remainder != 0 else A
            total_updates = math.ceil(nb / A)
            for update_step in range(total_updates):
                n_in_step = A if update_step != total_updates - 1 else remainder
                batch_samples = [next(it) for _ in range(n_in_step)]
                local = sum((b["labels"].ne(ign)).sum() for b in batch_samples)
                num_items_in_batch = accelerator.gather(local).sum().item()
                shim.saw_window_count(num_items_in_batch)
                for i, batch in enumerate(batch_samples):
                    if i < len(batch_samples) - 1 and accelerator.num_processes > 1:
                        ctx = model.no_sync
                    else:
                        ctx = contextlib.nullcontext
                    with ctx():
                        logits, labels = forward(batch)
                        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=ign,
                                               reduction="sum")
                        loss = (loss * A * accelerator.num_processes) / num_items_in_batch
                        accelerator.backward(loss)
                        shim.add_stack_loss(loss)
                optimizer.step()
                optimizer.zero_grad()

    facts = [f"accelerate {accelerate.__version__} loop, config {args.config}",
             f"distributed_type={accelerator.distributed_type}", f"even_batches={even}",
             f"{len(loader)} batches per rank per epoch, A={A}"]
    if args.config == "default":
        facts.append("accumulate(): sync every A-th microbatch or at end_of_dataloader (partial window stepped); "
                     "mean CE per microbatch; accelerator.backward divides by the nominal A; DDP averages over W")
    else:
        facts.append("docs token-level recipe: sum CE * A * W / gather(window count); model.no_sync but the "
                     "last microbatch; accelerator.backward divides by A; DDP averages over W")
    shim.finish(params, notes="; ".join(facts))
    common.shutdown()


if __name__ == "__main__":
    main()
