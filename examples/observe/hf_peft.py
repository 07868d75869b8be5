"""A LoRA fine-tune with PEFT under the Hugging Face Trainer, as the PEFT docs write it, with
gradcert's integration in it.

    torchrun --nproc_per_node 2 examples/observe/hf_peft.py                    # trains
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/hf_peft.py    # certified

The tiny Llama, corpus and tokenizer of hf_trainer.py; `get_peft_model(model, LoraConfig(r=4,
target_modules=["q_proj", "v_proj"], lora_dropout=0.05, task_type="CAUSAL_LM"))`: only the
adapters train, the base is frozen. gradcert's reference rebuilds the base from its config and
puts the same adapters on it (dropout off for the observed updates); frozen tensors must come
out of every step unchanged. The only gradcert line is `callbacks=[gradcert.hf.Callback()]`.

--average-tokens false  TrainingArguments(average_tokens_across_devices=False): each rank
                        normalises by its own token count (local-mean).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from hf_trainer import make_corpus, make_model, make_tokenizer
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

import gradcert


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float32")
    ap.add_argument("--average-tokens", choices=["true", "false"], default="true")
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "hf_peft_example"))
    args = ap.parse_args()

    texts = make_corpus(args.rows)
    tokenizer = make_tokenizer(texts)
    train = [tokenizer(t, truncation=True, max_length=32) for t in texts]
    torch.manual_seed(0)
    base = make_model("llama", tokenizer, getattr(torch, args.dtype))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.05,
                                            task_type="CAUSAL_LM"))
    targs = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=2, gradient_accumulation_steps=3, num_train_epochs=2,
        learning_rate=5e-3, lr_scheduler_type="linear", warmup_steps=2, max_grad_norm=1.0, use_cpu=True,
        ddp_backend="gloo", report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0,
        average_tokens_across_devices=args.average_tokens == "true")
    trainer = Trainer(model=model, args=targs, train_dataset=train,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                      callbacks=[gradcert.hf.Callback()])  # the one gradcert line
    trainer.train()


if __name__ == "__main__":
    main()
