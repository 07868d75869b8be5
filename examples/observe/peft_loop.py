"""A LoRA fine-tune in a plain PyTorch loop (PEFT's own examples write it this way), with gradcert's
integration in it: DDP or FSDP2 over a PeftModel, the loss computed outside the model.

    torchrun --nproc_per_node 2 examples/observe/peft_loop.py                     # trains
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/peft_loop.py     # certified

A tiny LlamaForCausalLM from its config (no hub download) under `get_peft_model(model,
LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.1))`: only the adapters train.
Float64 parameters, but Llama's RMSNorm computes in float32 inside, so gradcert holds the job to
float32's calibrated tolerance and says why (NOTE [inner precision]). `gradcert.watch(model,
optimizer)` is the one gradcert line; the reference rebuilds the Llama from its config and puts the
same adapters on it.

--wrap ddp | fsdp2     DistributedDataParallel, or fully_shard per decoder layer and the root
--loss global-mean     sum over the window / N of every rank, x world: the contract
--loss local-mean      each rank's sum / its own N
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

import gradcert

VOCAB = 64


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wrap", choices=["ddp", "fsdp2"], default="ddp")
    ap.add_argument("--loss", choices=["global-mean", "local-mean"], default="global-mean")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(config).double(),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1))
    if args.wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.base_model.model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        net = model
    else:
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-2)
    gradcert.watch(net, opt)  # the one gradcert line
    g = torch.Generator().manual_seed(7 + rank)
    for _ in range(args.steps):
        ids = torch.randint(1, VOCAB, (3, 12), generator=g)
        labels = ids.clone()
        labels[1, 5 + 3 * rank:] = -100  # a shorter row: padding (each rank its own count)
        logits = net(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), reduction="sum")
        n_local = float((labels[:, 1:] != -100).sum())
        n = torch.tensor(n_local)
        dist.all_reduce(n)
        (loss * world / n if args.loss == "global-mean" else loss / n_local).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
