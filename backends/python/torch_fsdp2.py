"""gradcert adapter: torch FSDP2 (torch.distributed.fsdp.fully_shard) on Gloo (CPU).

    torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
             --master_port=$GRADCERT_MASTER_PORT backends/python/torch_fsdp2.py [--mutant ID]

fully_shard on every unit (the tiny LM's blocks; for a factory's model
gradcert.ref.factory.units()), then on the root (the tiny LM: wte, wpe, ln_f, lm_head).
Parameters are DTensors sharded on dim 0 over the D ranks; the optimizer steps the local
shards.

NOTE [FSDP2 gradient scaling] FSDP2 reduce-scatters gradients and divides by the shard
group size D exactly once (torch 2.13 _fsdp_collectives._get_gradient_divide_factors:
without set_gradient_divide_factor the factor is D; float64 counts as "overflow risk",
so it is a SUM reduce-scatter with a pre-division of the local gradient and a
post-division of the shard, pre x post = D; float32/bf16 use ReduceOp.AVG, which
torch 2.13's Gloo implements for reduce_scatter_tensor). Averaging over D with D*S/N
per microstep gives sum S / N: we backpropagate D*S/N and never scale again; the
divide factor is left at its default.

Gradient accumulation: microsteps 0..A-2 run with set_requires_gradient_sync(False), so
FSDP2 accumulates unsharded gradients locally and reduce-scatters the sum on microstep
A-1 (FSDP1's no_sync). The forward still all-gathers parameters on every microstep, so a
rank with an empty microbatch runs a zero-loss forward/backward on every microstep
(NOTE [empty microbatch] in testbed/trainer.py).

Artifacts: per-rank shards (NOTE [shard artifacts], backends/PROTOCOL.md): every rank writes
the local pieces of its DTensor gradients and parameters with their placement, outside the
timed region; nothing is gathered (`--gather` writes full tensors from rank 0 instead, the
version-1 layout, via DTensor.full_tensor()).
"""

import argparse
import os
import sys

import torch  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from gradcert.ref import client, factory  # noqa: E402
from testbed import trainer as gm  # noqa: E402  (the test bed beside this script)

ADAPTER = "torch-fsdp2"


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


class FSDP2Strategy(gm.Strategy):
    name = ADAPTER
    empty_microsteps_need_collectives = True  # forward all-gathers parameters

    def __init__(self, model, gather=False):
        self.model, self.gather = model, gather

    def microstep(self, last):
        self.model.set_requires_gradient_sync(last, recurse=True)
        return gm.contextlib.nullcontext()

    # The gradients and parameters as the ranks hold them (DTensor shards), or gathered with --gather.
    def full_grads(self):
        f = full if self.gather else (lambda t: t)
        return {n: f(p.grad) if p.grad is not None else torch.zeros_like(f(p.detach()))
                for n, p in self.model.named_parameters()}

    def full_params(self):
        f = full if self.gather else (lambda t: t)
        return {n: f(p.detach()) for n, p in self.model.named_parameters()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gm.add_common_args(ap)
    ap.add_argument("--gather", action="store_true", help="write full tensors from rank 0 (artifacts schema 1)")
    args = ap.parse_args()
    run = gm.open_run()
    rank, world = gm.init_process_group(run)
    mesh = init_device_mesh(gm.device().type, (world,), mesh_dim_names=("dp",))
    bf16 = run.plan.dtype == torch.bfloat16
    # NOTE [FSDP2 mixed precision] bf16: the FSDP2 recipe — fp32 sharded (master) parameters and
    # optimizer state, bf16 all-gathered parameters for compute and bf16 gradient reduction.
    model = gm.build_model(run, torch.float32 if bf16 else run.plan.dtype)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 else MixedPrecisionPolicy()
    for unit in factory.units(model):
        fully_shard(unit, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    optimizer = gm.make_optimizer(model.parameters(), run.plan.optimizer, args.optim)
    backend = gm.backend_name(ADAPTER, args.mutant)
    writer = client.ArtifactWriter(run.out, rank, world, backend, run.plan.dtype, shards=not args.gather)
    gm.train(run, rank, world, model, FSDP2Strategy(model, args.gather), optimizer, writer, mutant=args.mutant)
    writer.finish({"optimizer": args.optim, "sampler": run.sampler},
                  notes="fully_shard per block + root; FSDP2 divides by D once (default divide factor); "
                        "backward D*S/N; no gradient sync on microsteps 0..A-2" + gm.device_note())
    gm.shutdown()


if __name__ == "__main__":
    main()
