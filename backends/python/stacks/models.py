"""Model factories for the real-stack shims (the factory contract of gradcert/ref/factory.py:
FUNC(vocab_size, max_len) -> nn.Module, forward(input_ids) -> logits or .logits).

gpt2_tiny: a Hugging Face GPT-2 from a tiny config (no hub download), the model the HF
Trainer shim certifies: transformers' own model and loss code, tied input / output
embeddings, dropout off (stack and reference must compute the same function), eager
attention (the same kernels in every transformers version the shims pin: the reference
runs the project venv's transformers, the stack its own)."""


def gpt2_tiny(vocab_size, max_len):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=vocab_size, n_positions=max_len, n_embd=16, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
    return GPT2LMHeadModel(cfg)


def gpt2_tiny_causal_loss(vocab_size, max_len):
    """gpt2_tiny with `loss_type = "ForCausalLM"` set on the model: what transformers 5.x infers
    by itself only for classes named *ForCausalLM (GPT2LMHeadModel gets loss_type None, so the
    Trainer counts num_items_in_batch on unshifted labels: hf-5/default). The control of that
    finding: same model and weights, the Trainer's count shifted."""
    m = gpt2_tiny(vocab_size, max_len)
    m.loss_type = "ForCausalLM"
    return m
