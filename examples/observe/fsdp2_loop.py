"""A plain PyTorch FSDP2 (`fully_shard`) training loop, with gradcert's integration in it.

    torchrun --nproc_per_node 2 examples/observe/fsdp2_loop.py                 # trains
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/fsdp2_loop.py   # certified

Each block and then the root sharded with `fully_shard` (DTensor parameters, gradients
reduce-scattered with FSDP2's default divide factor), gradient accumulation with
`set_requires_gradient_sync(False)` on all but the last micro-batch, DistributedSampler, AdamW,
`clip_grad_norm_` over the DTensor gradients. `gradcert.watch(model, optimizer, factory=build, loader=..., accum=...)`
is the only gradcert line; gradcert records each rank's local shards, never a gathered copy.

--loss global-mean  sum of token losses / N of the whole window (all ranks), times world
                    (FSDP2 averages the ranks' gradients): the contract.
--loss micro-mean   the micro-batch's mean token loss / A (what most loops do).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler
from toy import MAX_LEN, VOCAB, Rows, build, collate, token_loss

import gradcert


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loss", choices=["global-mean", "micro-mean"], default="global-mean")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build(VOCAB, MAX_LEN).to(getattr(torch, args.dtype))
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    micro, accum = 2, 2
    data = Rows(args.rows)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=micro, sampler=sampler, collate_fn=collate)
    gradcert.watch(model, opt, factory=build, loader=loader, accum=accum)  # the one gradcert line
    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for start in range(0, len(batches), accum):
            window = batches[start:start + accum]
            n = torch.tensor(float(sum(int((tg != -100).sum()) for _, tg in window)))
            dist.all_reduce(n)
            for i, (ids, tg) in enumerate(window):
                model.set_requires_gradient_sync(i == len(window) - 1)
                logits = model(ids, targets=tg)
                if args.loss == "global-mean":
                    loss = token_loss(logits, tg) / n * world
                else:
                    loss = token_loss(logits, tg, reduction="mean") / accum
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            step += 1
            if step >= args.steps:
                dist.destroy_process_group()
                return


if __name__ == "__main__":
    main()
