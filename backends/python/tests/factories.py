"""Model factories for tests/test_gradcert_ref.py and tests/test_gradcert_client.py: user models that are not gradcert's
tiny LM (other architecture, other parameter names), in the factory contract of
gradcert/ref/factory.py: FUNC(vocab_size, max_len) -> nn.Module, forward(ids) -> logits."""

import torch
import torch.nn as nn


class GRULM(nn.Module):
    """Embedding -> 1-layer GRU -> LayerNorm -> Linear head (with bias). Causal by
    construction, so right padding never changes a real position's logits."""

    def __init__(self, vocab_size: int, hidden: int = 12):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.rnn = nn.GRU(hidden, hidden, num_layers=1, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, input_ids):
        h, _ = self.rnn(self.embed(input_ids))
        return self.head(self.norm(h))


def gru_lm(vocab_size, max_len):
    return GRULM(vocab_size)


class _Out:
    def __init__(self, logits):
        self.logits = logits


class HalfInside(nn.Module):
    """Computes its MLP in float32 although its parameters are float64 (a model with a
    hard-coded autocast-like cast), and returns an object with .logits."""

    def __init__(self, vocab_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, vocab_size, bias=False)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        w, b = self.mlp[0].weight.float(), self.mlp[0].bias.float()
        h = torch.tanh(nn.functional.linear(x.float(), w, b)).to(x.dtype)
        return _Out(self.head(h))


def half_inside(vocab_size, max_len):
    return HalfInside(vocab_size)


def with_spec(vocab_size, max_len, spec=None):
    """Takes the keyword `spec` (the plan's model section)."""
    m = GRULM(vocab_size, hidden=int((spec or {}).get("d_model", 12)))
    m.seen_spec = spec
    return m


def not_a_module(vocab_size, max_len):
    return "nope"


def raises(vocab_size, max_len):
    raise RuntimeError("boom")


def gpt2_lm(vocab_size, max_len):
    """A Hugging Face GPT-2 from a tiny config (no hub download): transformers' own model
    code, tied input/output embeddings, dropout off (the reference and the stack must run
    the same function)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=vocab_size, n_positions=max_len, n_embd=16, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)
