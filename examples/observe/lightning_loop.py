"""A Lightning job as its docs show it, with gradcert's integration in it.

    python examples/observe/lightning_loop.py                                      # trains
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/lightning_loop.py   # certified

(run it with the Python that has lightning: `scripts/stack-env lightning` makes one.)
A LightningModule around the user's model (toy.py), `training_step` returning the loss,
`configure_optimizers` with AdamW; `L.Trainer(strategy="ddp", accumulate_grad_batches=A,
gradient_clip_val=1.0)` does the sampler, the accumulation (it divides what training_step
returns by A), DDP, clipping and the step. The only gradcert line is
`callbacks=[gradcert.lightning.Callback(factory=build)]`.

--loss mean          the micro-batch's mean token loss, what Lightning's examples return.
--loss token-global  sum of token losses * A * world / N, N the window's valid targets over
                     every rank (Lightning documents no token-level recipe; this is one).
"""

from __future__ import annotations

import argparse
import os

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from toy import MAX_LEN, VOCAB, Rows, build, collate, token_loss

import gradcert


class LitLM(L.LightningModule):
    def __init__(self, loss: str, accum: int):
        super().__init__()
        self.model = build(VOCAB, MAX_LEN)
        self.loss, self.accum = loss, accum
        self.window_n = None  # (window index, its valid targets over every rank)

    def training_step(self, batch, batch_idx):
        ids, tg = batch
        logits = self.model(ids, targets=tg)
        if self.loss == "mean":
            return token_loss(logits, tg, reduction="mean")
        return token_loss(logits, tg) * self.accum * self.trainer.world_size / self._n(batch_idx)

    def _n(self, batch_idx):
        """N of batch_idx's window: the valid targets of its micro-batches on every rank."""
        k = batch_idx // self.accum
        if self.window_n is None or self.window_n[0] != k:
            counts = [int((t != -100).sum()) for _, t in self.trainer.train_dataloader]
            n = torch.tensor(sum(counts[k * self.accum:(k + 1) * self.accum]), dtype=torch.float64)
            if dist.is_initialized():
                dist.all_reduce(n)
            self.window_n = (k, float(n))
        return self.window_n[1]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=0.01)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loss", choices=["mean", "token-global"], default="mean")
    ap.add_argument("--precision", default="64-true", help="Lightning's precision (64-true, 32-true, ...)")
    ap.add_argument("--rows", type=int, default=48)
    args = ap.parse_args()

    torch.manual_seed(0)
    accum = 3
    module = LitLM(args.loss, accum)
    loader = DataLoader(Rows(args.rows), batch_size=2, shuffle=True, collate_fn=collate)
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), strategy="ddp", accumulate_grad_batches=accum,
                        gradient_clip_val=1.0, precision=args.precision, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[gradcert.lightning.Callback(factory=build)])  # the one gradcert line
    trainer.fit(module, loader)


if __name__ == "__main__":
    main()
