"""gradcert adapter: torch FSDP1 (FullyShardedDataParallel, FULL_SHARD) on Gloo.

    torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
             --master_port=$GRADCERT_MASTER_PORT backends/python/torch_fsdp1.py

One FSDP unit per block (ModuleWrapPolicy) plus the root, FULL_SHARD, use_orig_params
(so parameters keep their canonical names and the optimizer sees them). FSDP1 divides
the reduce-scattered gradient by the world size once (pre/post divide factors whose
product is D), so each microstep backpropagates D*S/N; microsteps 0..A-2 run under
no_sync(). A rank with an empty microbatch runs a zero-loss forward/backward on every
microstep (its forward all-gathers parameters). Full gradients and parameters for the
artifacts come from summon_full_params(with_grads=True), outside the timed region.

NOTE [FSDP1 on CPU] Without device_id, torch 2.13 refuses CPU: _init_utils.py:390
(_init_device_handle) raises "FSDP needs a non-CPU accelerator device, but no accelerator
device is detected." With device_id=cpu the device handle wraps torch.cpu (is_available()
is true), FULL_SHARD runs on Gloo and really shards (2896 of 5792 parameters per rank at
world 2). If some torch build refuses CPU even so, the adapter prints "SKIP: FSDP1 needs
CUDA here: ..." with the error and its source line and exits 77, so gradcert's tests SKIP
instead of passing. GRADCERT_FSDP1_DEVICE_ID=none reproduces the refusal.
"""

import argparse
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402

import gradcert_model as gm  # noqa: E402

WRAP_PREFIX = "_fsdp_wrapped_module."


def canonical(name: str) -> str:
    return name.replace(WRAP_PREFIX, "")


class FSDP1Strategy(gm.Strategy):
    name = "torch-fsdp1"
    empty_microsteps_need_collectives = True

    def __init__(self, model):
        self.model = model

    def microstep(self, last):
        return gm.contextlib.nullcontext() if last else self.model.no_sync()

    def _gather(self, grads: bool):
        out = {}
        with FSDP.summon_full_params(self.model, writeback=False, rank0_only=False, with_grads=grads):
            for n, p in self.model.named_parameters():
                t = p.grad if grads else p
                out[canonical(n)] = t.detach().clone()
        return out

    def full_grads(self):
        return self._gather(True)

    def full_params(self):
        return self._gather(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gm.add_common_args(ap)
    args = ap.parse_args()
    run = gm.Run()
    rank, world = gm.init_process_group(run)
    bf16 = run.dtype == torch.bfloat16
    model = run.build_model(torch.float32 if bf16 else run.dtype)
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 else None
    # GRADCERT_FSDP1_DEVICE_ID=none reproduces the refusal (no device_id: FSDP1 looks for an
    # accelerator); the default passes device_id=cpu, which torch 2.13 accepts.
    device_id = None if os.environ.get("GRADCERT_FSDP1_DEVICE_ID") == "none" else torch.device("cpu")
    try:
        model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=device_id,
                     auto_wrap_policy=ModuleWrapPolicy({gm.Block}), use_orig_params=True, mixed_precision=mp)
        strategy = FSDP1Strategy(model)
        optimizer = gm.make_optimizer(model.parameters(), run.spec["optimizer"], args.optim)
        backend = "torch-fsdp1" + (f"+wrong-{args.wrong}" if args.wrong else "")
        rec = gm.Recorder(run, rank, world, backend)
        gm.train(run, rank, world, model, strategy, optimizer, rec, wrong=args.wrong)
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
    rec.finish({"optimizer": args.optim, "sampler": run.sampler},
               notes="FSDP1 FULL_SHARD, one unit per block + root, use_orig_params; divides by D once; "
                     "backward D*S/N; no_sync on microsteps 0..A-2")
    gm.shutdown()


if __name__ == "__main__":
    main()
