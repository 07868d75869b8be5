"""A Hugging Face Trainer job as a user writes one, with gradcert's integration in it.

    torchrun --nproc_per_node 2 examples/observe/hf_trainer.py                 # trains
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/hf_trainer.py   # certified

A tiny GPT-2 (or Llama) built from its config, a word-level tokenizer trained on a small
corpus that the script writes itself (no hub download), `DataCollatorForLanguageModeling(
mlm=False)` (labels = input_ids, padding at -100; the model shifts them), the Trainer's own
loop, sampler, accumulation, clipping and AdamW with a linear schedule. The only gradcert
line is `callbacks=[gradcert.hf.Callback()]`; outside `gradcert observe` it does nothing.

--arch gpt2   GPT2LMHeadModel: transformers 5.x infers `loss_type` from the class name, and
              this one has no "ForCausalLM" in it, so the Trainer counts num_items_in_batch
              on unshifted labels (one target too many per row).
--arch llama  LlamaForCausalLM: the same job with a *ForCausalLM model.
--deepspeed STAGE  the same job on the DeepSpeed engine, as HF's DeepSpeed docs write it:
              `TrainingArguments(deepspeed=config)` with ZeRO STAGE and the batch, accumulation
              and clipping left "auto" (the Trainer fills them in), the Trainer's own AdamW
              (no "optimizer" entry); --offload puts it on the CPU (`offload_optimizer`, with
              `zero_force_ds_cpu_optimizer: false`, which DeepSpeed asks for with a torch
              optimizer). Without a GPU: DeepSpeed's CPU accelerator and Gloo (`ddp_backend`),
              set below; DeepSpeed trains no float64.

NOTE [HF DeepSpeed on the CPU] With `deepspeed=` the Trainer builds accelerate's state without
its `ddp_backend`, and accelerate picks no backend without a GPU: every rank then believes it is
alone, reads the whole dataset and counts num_items_in_batch on its own rows (gradcert fails
batch.sample_ledger and targets.window_count on it: N = one rank's targets). On the CPU the
script therefore makes the state itself, with Gloo, and tells the Trainer to use it
(`accelerator_config={"use_configured_state": True}`, a TrainingArguments option). On a GPU the
Trainer's own NCCL state is used and none of this runs.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, PreTrainedTokenizerFast, Trainer, TrainingArguments)

import gradcert

WORDS = ("the a one two red blue cat dog sat ran on under over mat log fast slow and then it "
         "saw big small tree hill sun moon").split()


def make_corpus(lines: int, seed: int = 3) -> list:
    """Sentences of 2..20 words: rows of very different lengths, as real text has."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 20))) for _ in range(lines)]


def make_tokenizer(texts: list) -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained on the corpus (no hub download)."""
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[EOS]"])}
    for word in " ".join(texts).split():
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def make_model(arch: str, tokenizer, dtype: torch.dtype):
    ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    if arch == "gpt2":
        cfg = GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2, **ids)
        model = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=2, max_position_embeddings=64, **ids)
        model = LlamaForCausalLM(cfg)
    return model.to(dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float32")
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--deepspeed", type=int, choices=(0, 1, 2, 3), help="run on the DeepSpeed engine, this ZeRO stage")
    ap.add_argument("--offload", action="store_true", help="with --deepspeed: the optimizer on the CPU")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "hf_trainer_example"),
                    help="the Trainer's output_dir (nothing is saved)")
    args = ap.parse_args()

    texts = make_corpus(args.rows)
    tokenizer = make_tokenizer(texts)
    train = [tokenizer(t, truncation=True, max_length=32) for t in texts]

    torch.manual_seed(0)
    model = make_model(args.arch, tokenizer, getattr(torch, args.dtype))
    engine = {}
    if args.deepspeed is not None:
        zero = {"stage": args.deepspeed}
        if args.offload:
            zero["offload_optimizer"] = {"device": "cpu"}
        engine["deepspeed"] = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                               "gradient_clipping": "auto", "zero_optimization": zero,
                               "zero_force_ds_cpu_optimizer": False}
        if not torch.cuda.is_available():  # NOTE [HF DeepSpeed on the CPU]
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            from accelerate import PartialState

            os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # a state made for DeepSpeed, as the Trainer's
            PartialState(backend="gloo")  # own would be
            del os.environ["ACCELERATE_USE_DEEPSPEED"]
            engine["accelerator_config"] = {"use_configured_state": True}
    targs = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=2, gradient_accumulation_steps=3,
        num_train_epochs=2, learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.01,
        max_grad_norm=1.0, use_cpu=not engine, ddp_backend="gloo", report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, seed=0, **engine)
    trainer = Trainer(model=model, args=targs, train_dataset=train,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                      callbacks=[gradcert.hf.Callback()])  # the one gradcert line
    trainer.train()


if __name__ == "__main__":
    main()
