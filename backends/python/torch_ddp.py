"""gradcert adapter: torch DistributedDataParallel on Gloo (CPU), run with torchrun.

    torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
             --master_port=$GRADCERT_MASTER_PORT backends/python/torch_ddp.py [--mutant ID]

DDP all-reduces gradients and divides by the world size (= D here: data parallel only),
so each microstep backpropagates D * S_{r,a} / N; microsteps 0..A-2 run under no_sync()
(gradients accumulate locally), the last one triggers the all-reduce of the accumulated
gradient. The model is the plan's (spec.model.factory, else the built-in tiny LM).
See backends/PROTOCOL.md; the planted bugs (--mutant) are in testbed/mutants.py.
"""

import argparse
import os
import sys

import torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from gradcert.ref import client  # noqa: E402
from testbed import trainer as gm  # noqa: E402  (the test bed beside this script)

ADAPTER = "torch-ddp"


class DDPStrategy(gm.Strategy):
    name = ADAPTER
    # Under no_sync() a forward/backward runs no collective, so an empty non-final
    # microbatch is simply skipped; the final microstep always runs (NOTE [empty microbatch]).
    empty_microsteps_need_collectives = False

    def __init__(self, ddp: DDP, inner: torch.nn.Module):
        self.ddp, self.inner = ddp, inner

    def microstep(self, last):
        return gm.contextlib.nullcontext() if last else self.ddp.no_sync()

    def full_grads(self):
        return {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in self.inner.named_parameters()}

    def full_params(self):
        return {n: p for n, p in self.inner.named_parameters()}

    def replica_params(self):
        return list(self.inner.named_parameters())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gm.add_common_args(ap)
    args = ap.parse_args()
    run = gm.open_run()
    rank, world = gm.init_process_group(run)
    torch.manual_seed(0)
    inner = gm.build_model(run, run.plan.dtype)
    masters = None
    if run.plan.dtype == torch.bfloat16:
        # As in NOTE [mixed precision] (backends/runtime/replica.cpp): bf16 weights and
        # gradients for compute and the all-reduce, fp32 master weights and optimizer state.
        masters = {n: (p, p.detach().float().clone().requires_grad_(True)) for n, p in inner.named_parameters()}
        opt_params = [m for _, m in masters.values()]
    else:
        opt_params = list(inner.parameters())
    # bucket_cap_mb small: several buckets, as in real runs (the tiny model would otherwise
    # fit one); the reduction is per bucket, the result the same. The model has no buffers.
    ddp = DDP(inner, bucket_cap_mb=0.01, find_unused_parameters=False)
    optimizer = gm.make_optimizer(opt_params, run.plan.optimizer, args.optim)
    backend = gm.backend_name(ADAPTER, args.mutant)
    writer = client.ArtifactWriter(run.out, rank, world, backend, run.plan.dtype)
    gm.train(run, rank, world, ddp, DDPStrategy(ddp, inner), optimizer, writer, mutant=args.mutant, masters=masters)
    writer.finish({"optimizer": args.optim, "sampler": run.sampler},
                  notes="DDP averages over world=D; backward D*S/N per microstep; no_sync on microsteps 0..A-2" + gm.device_note())
    gm.shutdown()


if __name__ == "__main__":
    main()
