"""An accelerate training loop as its docs show it, with gradcert's integration in it.

    accelerate launch --num_processes 2 examples/observe/accelerate_loop.py        # trains
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/accelerate_loop.py   # certified

`Accelerator(gradient_accumulation_steps=A)`, `prepare(model, optimizer, loader, scheduler)`,
`with accelerator.accumulate(model):` backward / clip / step / zero_grad: accelerate's own
sampler sharding, no_sync and accumulation. `gradcert.watch(model, optimizer, factory=build, loader=loader, accum=accum)`
after `prepare` is the only gradcert line; outside `gradcert observe` it does nothing.

--loss mean          the loss of accelerate's examples: the micro-batch's mean token loss
                     (accelerate divides it by A): each micro-batch weighs the same.
--loss token-global  accelerate's documented token-level recipe ("Gradient accumulation",
                     loss normalisation by the number of items in the window): the window's
                     valid targets gathered over the ranks, sum loss * A * world / N
                     (accelerator.backward divides by A).
--deepspeed STAGE    the same loop on the DeepSpeed engine: `Accelerator(deepspeed_plugin=
                     DeepSpeedPlugin(zero_stage=STAGE, gradient_accumulation_steps=A,
                     gradient_clipping=1.0))`, --offload puts the optimizer on the CPU
                     (`offload_optimizer_device="cpu"`). `prepare` hands back the engine and
                     accelerate's wrapper of its optimizer, which is what gradcert.watch gets;
                     accelerator.backward runs engine.backward and engine.step, the engine
                     clips. DeepSpeed trains no float64: float32 only. Without a GPU the
                     script selects DeepSpeed's CPU accelerator and Gloo itself (below).
"""

from __future__ import annotations

import argparse
import os

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from toy import MAX_LEN, VOCAB, Rows, build, collate, token_loss

import gradcert


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loss", choices=["mean", "token-global"], default="mean")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float32")
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--deepspeed", type=int, choices=(0, 1, 2, 3), help="run on the DeepSpeed engine, this ZeRO stage")
    ap.add_argument("--offload", action="store_true", help="with --deepspeed: the optimizer on the CPU")
    args = ap.parse_args()

    accum = 3
    if args.deepspeed is None:
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accum)
    else:
        from accelerate import DeepSpeedPlugin, PartialState

        if not torch.cuda.is_available():  # DeepSpeed on the CPU: its CPU accelerator, and Gloo (accelerate
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # picks no backend without a GPU or cpu=True,
            PartialState(backend="gloo")  # and cpu=True turns DeepSpeed off)
        plugin = DeepSpeedPlugin(zero_stage=args.deepspeed, gradient_accumulation_steps=accum, gradient_clipping=1.0,
                                 offload_optimizer_device="cpu" if args.offload else "none")
        accelerator = Accelerator(gradient_accumulation_steps=accum, deepspeed_plugin=plugin)
    torch.manual_seed(0)
    model = build(VOCAB, MAX_LEN).to(getattr(torch, args.dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    loader = DataLoader(Rows(args.rows), batch_size=2, shuffle=True, collate_fn=collate)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=4)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    gradcert.watch(model, optimizer, factory=build, loader=loader, accum=accum)  # the one gradcert line

    for _ in range(args.epochs):
        batches = list(loader)
        for start in range(0, len(batches), accum):
            window = batches[start:start + accum]
            if args.loss == "token-global":  # the window's valid targets, every rank
                n = torch.tensor(sum(int((tg != -100).sum()) for _, tg in window))
                n = accelerator.gather(n).sum().item()
            for ids, tg in window:
                with accelerator.accumulate(model):
                    logits = model(ids, targets=tg)
                    if args.loss == "token-global":
                        # accelerator.backward divides by A: the recipe multiplies it back
                        loss = token_loss(logits, tg) * accum * accelerator.num_processes / n
                    else:
                        loss = token_loss(logits, tg, reduction="mean")
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()


if __name__ == "__main__":
    main()
