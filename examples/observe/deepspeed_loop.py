"""A DeepSpeed training loop as DeepSpeed's examples write it, with gradcert's integration in it.

    torchrun --nproc_per_node 2 examples/observe/deepspeed_loop.py --stage 2             # trains
    gradcert observe -- torchrun --nproc_per_node 2 examples/observe/deepspeed_loop.py --stage 2

`deepspeed.initialize(model=, optimizer=, config=)` with ZeRO --stage 0..3 (--offload: the
optimizer state and step on the CPU, `offload_optimizer: {device: cpu}`), the engine's own
accumulation (`engine.backward` scales by 1/A, `engine.step` steps at the engine's boundary) and
clipping (`gradient_clipping`), a DistributedSampler, torch AdamW. The loss is computed outside the
model (F.cross_entropy on the logits). `gradcert.watch(engine, engine.optimizer)` is the one gradcert
line (NOTE [DeepSpeed engine]). On a machine without a GPU DeepSpeed runs on its CPU accelerator
(DS_ACCELERATOR=cpu, set below as DeepSpeed's CPU docs do); it trains no float64, so float32.

--loss mean          the microbatch's mean token loss, engine.backward(loss): DeepSpeed's examples
                     (each microbatch weighs the same whatever its valid targets: micro-mean).
--loss token-global  sum of token losses x world / N of the whole window (all ranks), and
                     engine.backward(loss, scale_wrt_gas=False): the contract.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402
from toy import MAX_LEN, VOCAB, Rows, build, collate  # noqa: E402

import gradcert  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=2)
    ap.add_argument("--offload", action="store_true", help="offload_optimizer to the CPU (ZeRO 1-3)")
    ap.add_argument("--loss", choices=["mean", "token-global"], default="token-global")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    deepspeed.init_distributed("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build(VOCAB, MAX_LEN)
    micro, accum = 2, 2
    zero = {"stage": args.stage}
    if args.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
              "zero_optimization": zero, "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
              "gradient_clipping": 1.0, "steps_per_print": 1 << 30}
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    gradcert.watch(engine, engine.optimizer)  # the one gradcert line
    data = Rows(48)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
    loader = DataLoader(data, batch_size=micro, sampler=sampler, collate_fn=collate)
    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for start in range(0, len(batches) - accum + 1, accum):
            window = batches[start:start + accum]
            n = torch.tensor(float(sum(int((tg != -100).sum()) for _, tg in window)))
            dist.all_reduce(n)
            for ids, tg in window:
                logits = engine(ids)
                flat, targets = logits.reshape(-1, logits.size(-1)), tg.reshape(-1)
                if args.loss == "mean":
                    engine.backward(F.cross_entropy(flat, targets, ignore_index=-100))
                else:
                    loss = F.cross_entropy(flat, targets, ignore_index=-100, reduction="sum") * world / n
                    engine.backward(loss, scale_wrt_gas=False)
                engine.step()
            step += 1
            if step >= args.steps:
                return


if __name__ == "__main__":
    main()
