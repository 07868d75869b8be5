"""A plain PyTorch FSDP1 (`FullyShardedDataParallel`) training loop, the "before" side of an
FSDP1 -> FSDP2 migration (fsdp2_loop.py is an FSDP2 loop), with gradcert's integration in it.

    torchrun --nproc_per_node 2 examples/observe/fsdp1_loop.py                  # trains
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/fsdp1_loop.py   # certified

Each block is its own FSDP unit (ModuleWrapPolicy), the root another; `--orig-params true`
(`use_orig_params=True`, the optimizer sees the model's own parameters) or `false` (flat
parameters: the optimizer steps each unit's FlatParameter). Gradient accumulation under
`model.no_sync()`, DistributedSampler, AdamW, FSDP1's own `model.clip_grad_norm_` (--clip; torch
2.13's FSDP1 clipping refuses float64 gradients, so the float64 default does not clip). On the
CPU FSDP1 needs `device_id=torch.device("cpu")` (without it torch 2.13 asks for an accelerator). The loss is
computed outside the model (F.cross_entropy on the logits), and `gradcert.watch(model, optimizer)`
is the only gradcert line: gradcert gathers each unit's shards under the model's own names.

--loss global-mean  sum of token losses / N of the whole window, times world: the contract.
--loss micro-mean   the micro-batch's mean token loss / A.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.utils.data import DataLoader, DistributedSampler
from toy import MAX_LEN, VOCAB, Block, Rows, build, collate

import gradcert


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loss", choices=["global-mean", "micro-mean"], default="global-mean")
    ap.add_argument("--orig-params", choices=["true", "false"], default="true")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--clip", type=float, default=0.0, help="max norm for model.clip_grad_norm_ (0: none)")
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = FSDP(build(VOCAB, MAX_LEN).to(getattr(torch, args.dtype)), auto_wrap_policy=ModuleWrapPolicy({Block}),
                 use_orig_params=args.orig_params == "true", device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    micro, accum = 2, 2
    data = Rows(args.rows)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=micro, sampler=sampler, collate_fn=collate)
    gradcert.watch(model, opt)  # the one gradcert line
    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for start in range(0, len(batches), accum):
            window = batches[start:start + accum]
            n = torch.tensor(float(sum(int((tg != -100).sum()) for _, tg in window)))
            dist.all_reduce(n)
            for i, (ids, tg) in enumerate(window):
                with model.no_sync() if i < len(window) - 1 else torch.enable_grad():
                    logits = model(ids)
                    flat = logits.reshape(-1, logits.size(-1))
                    if args.loss == "global-mean":
                        loss = F.cross_entropy(flat, tg.reshape(-1), ignore_index=-100, reduction="sum") / n * world
                    else:
                        loss = F.cross_entropy(flat, tg.reshape(-1), ignore_index=-100) / accum
                    loss.backward()
            if args.clip > 0:
                model.clip_grad_norm_(args.clip)
            opt.step()
            opt.zero_grad()
            step += 1
            if step >= args.steps:
                dist.destroy_process_group()
                return


if __name__ == "__main__":
    main()
