"""A plain PyTorch DDP training job, as a user writes one, with gradcert's integration in it.

    torchrun --nproc_per_node 2 examples/observe/ddp_loop.py             # trains (gradcert idle)
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/ddp_loop.py   # certified

Its own model (an embedding, a GRU, a head), its own data (variable-length token rows, right
padded, pad targets -100), DistributedSampler, gradient accumulation with no_sync, AdamW
with a warm-up schedule and gradient clipping. `gradcert.watch(model, optimizer, factory=build)`
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
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import gradcert

VOCAB, MAX_LEN = 40, 16


class GruLM(nn.Module):
    def __init__(self, vocab_size: int, d: int = 12):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, vocab_size)

    def forward(self, input_ids, targets=None):
        h, _ = self.rnn(self.emb(input_ids))
        return self.head(h)


def build(vocab_size: int, max_len: int) -> nn.Module:
    """How gradcert's reference rebuilds this model (its weights come from the job)."""
    return GruLM(vocab_size)


class Rows(Dataset):
    """Token rows of 3..MAX_LEN tokens; targets are the next token (already shifted)."""

    def __init__(self, n: int, seed: int = 7):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(3, MAX_LEN + 1, (1,), generator=g))
            self.rows.append(torch.randint(1, VOCAB, (length + 1,), generator=g))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        return r[:-1], r[1:]


def collate(batch):
    T = max(len(x) for x, _ in batch)
    ids = torch.zeros(len(batch), T, dtype=torch.long)
    tg = torch.full((len(batch), T), -100, dtype=torch.long)
    for b, (x, y) in enumerate(batch):
        ids[b, : len(x)], tg[b, : len(y)] = x, y
    return ids, tg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loss", choices=["global-mean", "micro-mean", "local-mean"], default="global-mean")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--micro", type=int, default=3, help="rows per rank per micro-batch")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per update")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=96)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = GruLM(VOCAB).to(dtype)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    # The one line gradcert needs (a no-op outside `gradcert observe`).
    gradcert.watch(ddp, opt, factory=build, job={"expect_batch": args.micro * args.accum * world,
                                                 "dataset_size": args.rows, "drop_last": False})

    data = Rows(args.rows)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=args.micro, sampler=sampler, collate_fn=collate)
    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        window = []
        for batch in loader:
            window.append(batch)
            if len(window) < args.accum:
                continue
            n_local = sum(int((tg != -100).sum()) for _, tg in window)
            n_global = torch.tensor(float(n_local))
            dist.all_reduce(n_global)
            for i, (ids, tg) in enumerate(window):
                last = i == len(window) - 1
                ctx = ddp.no_sync() if not last else torch.enable_grad()
                with ctx:
                    logits = ddp(ids, targets=tg)
                    flat = logits.reshape(-1, logits.size(-1)), tg.reshape(-1)
                    if args.loss == "global-mean":
                        loss = F.cross_entropy(*flat, ignore_index=-100, reduction="sum") / n_global * world
                    elif args.loss == "local-mean":
                        loss = F.cross_entropy(*flat, ignore_index=-100, reduction="sum") / n_local
                    else:
                        loss = F.cross_entropy(*flat, ignore_index=-100) / args.accum
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
