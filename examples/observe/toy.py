"""The model and data of the plain-PyTorch examples (ddp_loop.py, accelerate_loop.py,
fsdp2_loop.py, lightning_loop.py): what a user's own job brings, nothing of gradcert's.

TinyLM is a small causal transformer whose forward takes (input_ids, targets=None) and returns
logits, as nanoGPT-style models do; `build(vocab_size, max_len)` is how gradcert's reference
rebuilds it (the weights come from the job). Rows are token sequences of 3..MAX_LEN tokens,
right padded by `collate`, targets already shifted (pad targets -100).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

VOCAB, MAX_LEN = 40, 16


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(a)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, max_len: int, d: int = 16, layers: int = 2, heads: int = 2):
        super().__init__()
        self.max_len = max_len
        self.wte, self.wpe = nn.Embedding(vocab_size, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab_size)

    def forward(self, input_ids, targets=None):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.size(1), device=input_ids.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def build(vocab_size: int, max_len: int) -> nn.Module:
    """How gradcert's reference rebuilds this model (its weights come from the job)."""
    return TinyLM(vocab_size, max_len)


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
    """Right padding: pad id 0, pad targets -100."""
    T = max(len(x) for x, _ in batch)
    ids = torch.zeros(len(batch), T, dtype=torch.long)
    tg = torch.full((len(batch), T), -100, dtype=torch.long)
    for b, (x, y) in enumerate(batch):
        ids[b, : len(x)], tg[b, : len(y)] = x, y
    return ids, tg


def token_loss(logits, targets, reduction="sum"):
    """Cross-entropy over the valid targets (-100 ignored)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100,
                           reduction=reduction)
