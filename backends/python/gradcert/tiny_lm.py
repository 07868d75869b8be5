"""The built-in model: the same tiny causal LM as conformance/model/model.cpp, with the same
canonical parameter names, and `tiny_lm`, its model factory (`gradcert.tiny_lm:tiny_lm`,
the name specs, backends/python/stacks/matrix.json and gradcert's C++ side use; see
gradcert/ref/factory.py). Plain PyTorch.

The PyTorch adapters train it (their trainer, mutants and checkpoint legs are the test bed,
backends/python/testbed/, not part of the installed package).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-LN causal self-attention and MLP, each with a residual."""

    def __init__(self, d_model: int, heads: int, d_ff: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)  # NOTE [no key bias] in model.cpp
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.fc = nn.Linear(d_model, d_ff)
        self.fc_out = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)

        def split(t):
            return t.view(B, T, self.heads, hd).transpose(1, 2)

        q, k, v = split(q), split(k), split(v)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
        # Causal mask. With right padding, real positions never attend to padding.
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        att = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(B, T, C)
        h = x + self.proj(att)
        return h + self.fc_out(F.gelu(self.fc(self.ln2(h))))  # exact (erf) GELU


class TinyLM(nn.Module):
    """Canonical names: wte.weight, wpe.weight, blocks.<i>.{ln1,qkv,proj,ln2,fc,fc_out}.*,
    ln_f.*, lm_head.weight."""

    def __init__(self, m: dict):
        super().__init__()
        self.wte = nn.Embedding(m["vocab"], m["d_model"])
        self.wpe = nn.Embedding(m["max_len"], m["d_model"])
        self.blocks = nn.ModuleList(Block(m["d_model"], m["heads"], m["d_ff"]) for _ in range(m["layers"]))
        self.ln_f = nn.LayerNorm(m["d_model"], eps=1e-5)
        self.lm_head = nn.Linear(m["d_model"], m["vocab"], bias=False)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        T = input.size(1)
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(input) + self.wpe(pos).unsqueeze(0)
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x))

    def gradcert_units(self):
        """The FSDP units (besides the root): one per block."""
        return list(self.blocks)


#: The spec's model defaults (conformance/core/spec.hpp), for tiny_lm without a `spec`.
TINY_LM_DEFAULTS = {"vocab": 32, "d_model": 16, "heads": 2, "layers": 2, "d_ff": 32, "max_len": 24}


def tiny_lm(vocab_size: int, max_len: int, spec: dict | None = None) -> TinyLM:
    """The built-in model factory (`gradcert.tiny_lm:tiny_lm`, see gradcert/ref/factory.py):
    vocab and max_len from the arguments, d_model / heads / layers / d_ff from `spec`
    (the plan's model section) where it has them, else TINY_LM_DEFAULTS."""
    m = dict(TINY_LM_DEFAULTS)
    for k in ("d_model", "heads", "layers", "d_ff"):
        if spec and k in spec:
            m[k] = int(spec[k])
    m["vocab"], m["max_len"] = int(vocab_size), int(max_len)
    return TinyLM(m)
