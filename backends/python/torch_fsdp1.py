"""gradcert adapter: torch FSDP1 (FullyShardedDataParallel, FULL_SHARD) on Gloo.

    torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
             --master_port=$GRADCERT_MASTER_PORT backends/python/torch_fsdp1.py [--mutant ID]

One FSDP unit per block (the tiny LM's blocks; for a factory's model the modules of
gradcert.ref.factory.units()) plus the root, FULL_SHARD, use_orig_params (so parameters
keep their canonical names and the optimizer sees them). FSDP1 divides the
reduce-scattered gradient by the world size once (pre/post divide factors whose product
is D), so each microstep backpropagates D*S/N; microsteps 0..A-2 run under no_sync(). A
rank with an empty microbatch runs a zero-loss forward/backward on every microstep (its
forward all-gathers parameters). Full gradients and parameters for the artifacts come
from summon_full_params(with_grads=True), outside the timed region.

NOTE [FSDP1 on CPU] Without device_id, torch 2.13 refuses CPU: _init_utils.py:390
(_init_device_handle) raises "FSDP needs a non-CPU accelerator device, but no accelerator
device is detected." With device_id=cpu the device handle wraps torch.cpu (is_available()
is true), FULL_SHARD runs on Gloo and really shards (2896 of 5792 parameters per rank at
world 2). If some torch build refuses CPU even so, the adapter prints "SKIP: FSDP1 needs
CUDA here: ..." with the error and its source line and exits 77, so gradcert's tests SKIP
instead of passing. GRADCERT_FSDP1_DEVICE_ID=none reproduces the refusal.
"""

import argparse
import functools
import os
import sys
import traceback

import torch  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy  # noqa: E402
from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy  # noqa: E402

from gradcert.ref import client, factory  # noqa: E402
from testbed import trainer as gm  # noqa: E402  (the test bed beside this script)

ADAPTER = "torch-fsdp1"
WRAP_PREFIX = "_fsdp_wrapped_module."


def canonical(name: str) -> str:
    return name.replace(WRAP_PREFIX, "")


class FSDP1Strategy(gm.Strategy):
    name = ADAPTER
    empty_microsteps_need_collectives = True

    def __init__(self, model):
        self.model = model

    def microstep(self, last):
        return gm.contextlib.nullcontext() if last else self.model.no_sync()

    def _gather(self, grads: bool):
        out = {}
        with FSDP.summon_full_params(self.model, writeback=False, rank0_only=False, with_grads=grads):
            for n, p in self.model.named_parameters():
                t = (p.grad if p.grad is not None else torch.zeros_like(p)) if grads else p
                out[canonical(n)] = t.detach().clone()
        return out

    def full_grads(self):
        return self._gather(True)

    def full_params(self):
        return self._gather(False)

    def clip_grad_norm(self, params, max_norm):
        """FSDP1's own clip_grad_norm_ (the norm over every rank's shards), except in float64.

        NOTE [FSDP1 float64 clipping] torch 2.13's FSDP._get_grad_norm calls
        vector_norm(grad, dtype=torch.float32), which raises "the dtype of the input
        (Double) should be convertible without narrowing" for float64 gradients. There the
        same formula by hand: the local shards' sum of squares, all-reduced (shards do not
        overlap; padding holds no gradient), coef = min(1, max / (norm + 1e-6))."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not any(g.dtype == torch.float64 for g in grads):
            self.model.clip_grad_norm_(max_norm)
            return
        sq = torch.zeros((), dtype=torch.float64)
        for g in grads:
            sq += g.detach().to(torch.float64).pow(2).sum()
        gm.dist.all_reduce(sq)
        coef = min(1.0, max_norm / (float(sq.sqrt()) + 1e-6))
        with torch.no_grad():
            for g in grads:
                g.mul_(coef)


def wrap_policy(model):
    """One FSDP unit per module of factory.units() (for the tiny LM: each Block, which is
    what ModuleWrapPolicy({Block}) wraps)."""
    unit_ids = {id(m) for m in factory.units(model)}
    return functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in unit_ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gm.add_common_args(ap)
    args = ap.parse_args()
    run = gm.open_run()
    rank, world = gm.init_process_group(run)
    bf16 = run.plan.dtype == torch.bfloat16
    model = gm.build_model(run, torch.float32 if bf16 else run.plan.dtype)
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 else None
    # GRADCERT_FSDP1_DEVICE_ID=none reproduces the refusal (no device_id: FSDP1 looks for an
    # accelerator); the default passes device_id=cpu, which torch 2.13 accepts.
    device_id = None if os.environ.get("GRADCERT_FSDP1_DEVICE_ID") == "none" else gm.device()
    try:
        model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=device_id,
                     auto_wrap_policy=wrap_policy(model), use_orig_params=True, mixed_precision=mp)
        strategy = FSDP1Strategy(model)
        optimizer = gm.make_optimizer(model.parameters(), run.plan.optimizer, args.optim)
        backend = gm.backend_name(ADAPTER, args.mutant)
        writer = client.ArtifactWriter(run.out, rank, world, backend, run.plan.dtype)
        gm.train(run, rank, world, model, strategy, optimizer, writer, mutant=args.mutant)
    except (RuntimeError, AssertionError, AttributeError) as e:
        msg = str(e)
        cpu_refusals = ("FSDP does not support CPU only execution", "non-CPU accelerator",
                        "Custom backend 'cpu' not implement")
        if any(s in msg for s in cpu_refusals) and not torch.cuda.is_available():
            tb = traceback.extract_tb(e.__traceback__)[-1]
            print(f"gradcert adapter: SKIP: FSDP1 needs CUDA here: torch {torch.__version__} refuses CPU-only "
                  f"execution: {type(e).__name__}: {msg} (raised at {tb.filename}:{tb.lineno})",
                  file=sys.stderr, flush=True)
            os._exit(gm.EXIT_SKIP)  # skip collectives/teardown: peers may be mid-collective
        raise
    writer.finish({"optimizer": args.optim, "sampler": run.sampler},
                  notes="FSDP1 FULL_SHARD, one unit per block + root, use_orig_params; divides by D once; "
                        "backward D*S/N; no_sync on microsteps 0..A-2" + gm.device_note())
    gm.shutdown()


if __name__ == "__main__":
    main()
