"""fsdp1_loop.py ported to FSDP2 as the PyTorch FSDP2 migration notes describe it: the "after" side
of the FSDP1 -> FSDP2 migration audit (`gradcert audit-jobs`, docs/migration.md).

    torchrun --nproc_per_node 2 examples/observe/fsdp2_port.py                   # trains
    gradcert audit-jobs --before 'torchrun ... fsdp1_loop.py' --after 'torchrun ... fsdp2_port.py'

The port: `FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}))` ->
`fully_shard(block)` for each block, then `fully_shard(model)`; `use_orig_params` is gone (FSDP2's
parameters are the model's own, as DTensors); `model.no_sync()` -> `set_requires_gradient_sync(False)`
on all but the last micro-batch; FSDP1's `model.clip_grad_norm_` -> `torch.nn.utils.clip_grad_norm_`
over the DTensor gradients. Data, sampler, loss (outside the model) and optimizer are unchanged, and
`gradcert.watch(model, optimizer)` stays the one gradcert line.

Planted departures, for the audit to find and locate:
--loss local-mean  the port divides each rank's window sum by its own count (no all-reduce of N)
--sampler-seed S   the port's DistributedSampler seed (the FSDP1 job's is 3)
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler
from toy import MAX_LEN, VOCAB, Rows, build, collate

import gradcert


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loss", choices=["global-mean", "local-mean"], default="global-mean")
    ap.add_argument("--sampler-seed", type=int, default=3)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--clip", type=float, default=0.0, help="max norm for clip_grad_norm_ (0: none)")
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
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.sampler_seed)
    loader = DataLoader(data, batch_size=micro, sampler=sampler, collate_fn=collate)
    gradcert.watch(model, opt)  # the one gradcert line
    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for start in range(0, len(batches), accum):
            window = batches[start:start + accum]
            n_local = float(sum(int((tg != -100).sum()) for _, tg in window))
            n = torch.tensor(n_local)
            dist.all_reduce(n)
            for i, (ids, tg) in enumerate(window):
                model.set_requires_gradient_sync(i == len(window) - 1)
                logits = model(ids)
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tg.reshape(-1), ignore_index=-100,
                                       reduction="sum")
                (loss / n * world if args.loss == "global-mean" else loss / n_local).backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad()
            step += 1
            if step >= args.steps:
                dist.destroy_process_group()
                return


if __name__ == "__main__":
    main()
