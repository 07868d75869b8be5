"""A plain PyTorch DDP training job, as a user writes one, with gradcert's integration in it.

    torchrun --nproc_per_node 2 examples/observe/ddp_loop.py             # trains (gradcert idle)
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/ddp_loop.py   # certified

Its own model and data (toy.py: a small causal transformer, variable-length token rows, right
padded, pad targets -100), DistributedSampler, gradient accumulation with no_sync, AdamW
with a warm-up schedule and gradient clipping. `gradcert.watch(model, optimizer, factory=build, loader=..., accum=...)`
is the only line gradcert needs; outside `gradcert observe` it does nothing.

--loss picks how the job normalises its loss, the choice real loops get wrong:
  global-mean  sum of token losses over the window / N counted over every rank's micro-batches
               of the window, times world (DDP averages the ranks' gradients): the contract.
  micro-mean   F.cross_entropy's default mean per micro-batch / accum (what most loops do):
               every micro-batch weighs the same whatever its number of valid targets.
  local-mean   each rank's window sum / that rank's own count (no all-reduce of N).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from toy import MAX_LEN, VOCAB, Rows, build, collate, token_loss

import gradcert


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loss", choices=["global-mean", "micro-mean", "local-mean"], default="global-mean")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--micro", type=int, default=3, help="rows per rank per micro-batch")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per update")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: cuda:LOCAL_RANK, NCCL (one GPU per rank), TF32 off")
    args = ap.parse_args()

    if args.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = build(VOCAB, MAX_LEN).to(dev, dtype)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    data = Rows(args.rows)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=args.micro, sampler=sampler, collate_fn=collate)
    # The one line gradcert needs (a no-op outside `gradcert observe`).
    gradcert.watch(ddp, opt, factory=build, loader=loader, accum=args.accum)
    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        window = []
        for ids, tg in loader:
            window.append((ids.to(dev), tg.to(dev)))
            if len(window) < args.accum:
                continue
            n_local = sum(int((tg != -100).sum()) for _, tg in window)
            n_global = torch.tensor(float(n_local), device=dev)
            dist.all_reduce(n_global)
            for i, (ids, tg) in enumerate(window):
                last = i == len(window) - 1
                ctx = ddp.no_sync() if not last else torch.enable_grad()
                with ctx:
                    logits = ddp(ids, targets=tg)
                    if args.loss == "global-mean":
                        loss = token_loss(logits, tg) / n_global * world
                    elif args.loss == "local-mean":
                        loss = token_loss(logits, tg) / n_local
                    else:
                        loss = token_loss(logits, tg, reduction="mean") / args.accum
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            window = []
            step += 1
            if step >= args.steps:
                if rank == 0:
                    print(f"trained {step} updates")
                dist.destroy_process_group()
                return


if __name__ == "__main__":
    main()
