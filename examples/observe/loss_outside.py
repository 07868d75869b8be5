"""A plain PyTorch DDP loop as most people write it: the model returns logits, the loop computes
the loss itself, and gradcert's one line is `gradcert.watch(model, optimizer)`.

    torchrun --nproc_per_node 2 examples/observe/loss_outside.py                   # trains
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/loss_outside.py   # certified

The model is defined here, in the script (no factory: gradcert rebuilds it from the job's
own module, NOTE [the job's own module]); labels are the inputs with padding at -100, shifted in the loss
call (`logits[:, :-1]` against `labels[:, 1:]`), as causal-LM tutorials write it. gradcert learns
which positions are targets from that F.cross_entropy call (NOTE [loss outside the model]).

--loss picks the normalisation (the choice real loops get wrong):
  global-mean  sum over the window / N of every rank's window, times world (DDP averages): the contract
  micro-mean   F.cross_entropy's default mean per micro-batch / accum
  local-mean   each rank's window sum / its own count
--style picks how the loss call is written: slice (F.cross_entropy on a shifted slice, reshaped),
module (nn.CrossEntropyLoss on [B, V, T], logits through .float(), as bf16 jobs upcast: at float64
that rounds the loss to float32, and gradcert says so), nll (log_softmax + F.nll_loss).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import gradcert

VOCAB, MAX_LEN = 48, 16


class CausalLM(nn.Module):
    """A small causal transformer (token + position embeddings, pre-norm encoder layers with a
    causal mask, tied-free head); forward(input_ids) -> logits."""

    def __init__(self, vocab: int, max_len: int, d: int = 24, layers: int = 2, heads: int = 2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, input_ids):
        T = input_ids.size(1)
        x = self.tok(input_ids) + self.pos(torch.arange(T, device=input_ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=input_ids.device, dtype=x.dtype)
        return self.head(self.norm(self.body(x, mask=mask, is_causal=True)))


class Rows(Dataset):
    def __init__(self, n: int, seed: int = 11):
        g = torch.Generator().manual_seed(seed)
        self.rows = [torch.randint(1, VOCAB, (int(torch.randint(3, MAX_LEN + 1, (1,), generator=g)),), generator=g)
                     for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    labels = torch.full((len(rows), T), -100, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
        labels[b, : len(r)] = r
    return ids, labels


def loss_sum(logits, labels, style: str, reduction: str = "sum"):
    if style == "module":
        return nn.CrossEntropyLoss(reduction=reduction)(logits[:, :-1].float().transpose(1, 2), labels[:, 1:])
    if style == "nll":
        logp = F.log_softmax(logits[:, :-1], dim=-1)
        return F.nll_loss(logp.reshape(-1, logp.size(-1)), labels[:, 1:].reshape(-1), reduction=reduction)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                           ignore_index=-100, reduction=reduction)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loss", choices=["global-mean", "micro-mean", "local-mean"], default="global-mean")
    ap.add_argument("--style", choices=["slice", "module", "nll"], default="slice")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--micro", type=int, default=3)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=24, help="model width (--width 512 --layers 5: 10.6M parameters)")
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = CausalLM(VOCAB, MAX_LEN, d=args.width, layers=args.layers).to(getattr(torch, args.dtype))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3, weight_decay=0.01)
    data = Rows(96)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=args.micro, sampler=sampler, collate_fn=collate)
    gradcert.watch(ddp, opt)  # the one line gradcert needs (a no-op outside `gradcert observe`)
    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        window = []
        for batch in loader:
            window.append(batch)
            if len(window) < args.accum:
                continue
            n_local = sum(int((labels[:, 1:] != -100).sum()) for _, labels in window)
            n_global = torch.tensor(float(n_local))
            dist.all_reduce(n_global)
            for i, (ids, labels) in enumerate(window):
                with ddp.no_sync() if i < len(window) - 1 else torch.enable_grad():
                    logits = ddp(ids)
                    if args.loss == "global-mean":
                        loss = loss_sum(logits, labels, args.style) / n_global * world
                    elif args.loss == "local-mean":
                        loss = loss_sum(logits, labels, args.style) / n_local
                    else:
                        loss = loss_sum(logits, labels, args.style, "mean") / args.accum
                    loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            window = []
            step += 1
            if step >= args.steps:
                dist.destroy_process_group()
                return


if __name__ == "__main__":
    main()
