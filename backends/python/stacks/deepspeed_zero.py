"""gradcert shim: a DeepSpeed engine (`deepspeed.initialize`, ZeRO stage 0-3) under torchrun
(Gloo, CPU accelerator).

    DS_ACCELERATOR=cpu torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
        --master_port=$GRADCERT_MASTER_PORT backends/python/stacks/deepspeed_zero.py --config stage2

The engine runs its own training path: its data loader (`engine.deepspeed_io`, a
DeepSpeedDataLoader), its gradient accumulation (`engine.backward` scales by
1/gradient_accumulation_steps; the engine decides the boundary with its micro-step counter,
`is_gradient_accumulation_boundary()`), its ZeRO reduction / partitioning and its optimizer
step (`engine.step()`). The DeepSpeed training loop is the user's own code, written as the
DeepSpeed examples write it:

    for batch in loader:                       # DeepSpeedDataLoader
        logits = engine(batch["input_ids"])
        loss = F.cross_entropy(logits, labels, ignore_index=-100)   # the microbatch's mean
        engine.backward(loss)
        engine.step()                          # steps only at the accumulation boundary

The shim only:
  - gives the loader a dataset in the plan's order (common.global_order "samples": the
    DistributedSampler gives example i to DP rank i mod D), labels already shifted, and a
    `DistributedSampler(shuffle=False, drop_last=False)` through `deepspeed_io(data_sampler=)`
    (`deepspeed.initialize(training_data=...)` builds the same loader but with the
    DistributedSampler's default shuffle=True, seed 0, and never calls set_epoch), no loader
    workers, no pinned memory;
  - passes the plan's optimizer (torch SGD / AdamW, `zero_allow_untested_optimizer`: no fused
    op builds on CPU), `gradient_clipping` = the plan's max_grad_norm, no LR schedule;
  - observes: the ids and logits of every forward (gradcert's S on the stack's logits); at the
    boundary, between the last `engine.backward()` and `engine.step()`, the reduced gradient
    (`deepspeed.utils.safe_get_full_grad`: p.grad at stage 0, the gathered fp32 partitions at
    1-3, before clipping: the engine / ZeRO clip inside step()); after a step that was applied
    (`engine.was_step_applied()`) the parameters (`safe_get_full_fp32_param`: the fp32 master
    partitions gathered at 1-3; the module's own parameters at stage 0).
The model is the plan's (`--model`), built in float32.

Configurations (--config):
  stage0 .. stage3   DeepSpeed's defaults at that ZeRO stage: loss = the microbatch's mean token
                     loss, `engine.backward(loss)` (x 1/A), the engine's own boundary counter.
  token-global       DeepSpeed (0.19) documents no token-level recipe for the engine (its
                     `ChunkedCausalLMLoss` takes an HF `num_items_in_batch` but the engine never
                     computes one), so this is the manual recipe, at --stage (default 2): the
                     loop prefetches the engine's window (A microbatches from the loader),
                     all-reduces its valid-target count N, and backpropagates
                     loss = S_r,a * D / N with `engine.backward(loss, scale_wrt_gas=False)`
                     (the engine averages over the D ranks). The boundary stays the engine's.
  token-global-flush the same, and the loop sets the boundary itself on every microbatch
                     (`engine.set_gradient_accumulation_boundary`, the documented override), True
                     on the last microbatch of each window, so a partial final window is stepped.
  --offload          `offload_optimizer: {device: cpu}` (ZeRO 1-3; the plan's torch optimizer steps on
                     the host: `zero_force_ds_cpu_optimizer: false`).
  --ga1              token-global-flush with gradient_accumulation_steps=1: the window's A backward
                     calls make one step through the loop's boundary override (DeepSpeed #7665).

Facts found (DeepSpeed 0.19.8, torch 2.13.0 CPU, Gloo; the run's notes repeat them):
  - no float64: stage 0 asserts on fp64 gradients and ZeRO 1-3 reduce in fp32; this shim
    certifies float32 plans (bfloat16 is not wired) and skips (77) otherwise;
  - the first run JIT-builds the CPU accelerator's `deepspeed_shm_comm` op (g++, cached in
    TORCH_EXTENSIONS_DIR, default here .venv-stacks/deepspeed/torch_extensions);
  - the loader's DistributedSampler pads each rank to ceil(len / D) examples; ranks then hold
    equally many microbatches, so no rank runs an empty microstep;
  - the engine steps every A-th micro-step: a final window of fewer than A microbatches is
    accumulated but never stepped (with more epochs it would be carried into the next epoch's
    first window), unless the loop overrides the boundary (token-global-flush);
  - DeepSpeedDataLoader.__iter__ rebuilds its DataLoader: `itertools.islice(iter(loader), A)`
    restarts the epoch at every call (the token-global loop calls next() by hand);
  - under torchrun a rank's exit 77 (the float64 skip) comes back as torchrun's exit 1
    (ChildFailedError, "exitcode: 77" and the SKIP line in the rank log).
Measured (gradcert run --world 2 --dtype float32 --sampler-audit, the default spec, tiny_lm):
  stage0..stage3          updates 0, 1 micro-mean (~3.6e-07), update 2 drop-partial-window:
                          grad.parity / grad.scale / params.parity fail;
  token-global (stage 2)  updates 0, 1 global-mean, update 2 drop-partial-window (fails);
  token-global-flush      global-mean at stages 0-3 (every check passes);
  ... --offload           global-mean at stages 1-2 in 0.19.8, with and without --ga1; in 0.18.6
                          (before DeepSpeed #7967 / #7981) stage 2 computes first-and-last-microsteps
                          (--ga1: last-microstep-only); stage 1 passes (docs/real-stacks.md).
"""

import argparse
import datetime
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# The JIT-built CPU comm op is cached inside the stack's own venv (one per DeepSpeed version).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))

import common  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import deepspeed  # noqa: E402
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad  # noqa: E402
except Exception as e:  # pragma: no cover - environment problem
    common.skip(f"deepspeed cannot be imported: {e}")

CONFIGS = ("stage0", "stage1", "stage2", "stage3", "token-global", "token-global-flush")


def logits_of(out):
    if isinstance(out, dict):
        return out["logits"]
    return out.logits if hasattr(out, "logits") else out


def parse_args():
    """The command line, checked, with the resolved zero_stage, token, flush and config_name added."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=CONFIGS, default="stage2")
    ap.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=None,
                    help="ZeRO stage (token-global*: default 2; stageN: must agree)")
    ap.add_argument("--offload", action="store_true",
                    help="offload_optimizer to the CPU (ZeRO 1-3): the optimizer state and step on the host")
    ap.add_argument("--ga1", action="store_true",
                    help="token-global-flush only: gradient_accumulation_steps=1, the window's A backward "
                         "calls per step set by the loop's boundary override (DeepSpeed #7665's multi-backward)")
    args = ap.parse_args()
    token = args.config.startswith("token-global")
    flush = args.config == "token-global-flush"
    if token:
        stage = 2 if args.stage is None else args.stage
    else:
        stage = int(args.config[-1])
        if args.stage is not None and args.stage != stage:
            common.fail(f"--config {args.config} with --stage {args.stage}")
    if args.offload and stage == 0:
        common.fail("--offload needs ZeRO stage 1-3 (DeepSpeed offloads the optimizer of a ZeRO optimizer)")
    if args.ga1 and not flush:
        common.fail("--ga1 needs --config token-global-flush (the loop must set the boundary itself)")
    args.config_name = (f"{args.config}-stage{stage}" if token else args.config) + \
        ("-offload" if args.offload else "") + ("-ga1" if args.ga1 else "")
    args.zero_stage, args.token, args.flush = stage, token, flush
    return args


def engine_config(plan, args, ga: int) -> dict:
    """The DeepSpeed config: the plan's micro batch, `ga` accumulation steps, ZeRO, clipping."""
    zero = {"stage": args.zero_stage}
    if args.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": plan.micro,
        "gradient_accumulation_steps": ga,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,  # the plan's torch optimizer, also when offloaded
        "gradient_clipping": plan.max_grad_norm,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


class EngineLoop:
    """The DeepSpeed engine, its loader, and what the loop observes of it at each microstep."""

    def __init__(self, shim, args):
        """init_distributed (Gloo), then the plan's model and optimizer through deepspeed.initialize."""
        plan = shim.plan
        self.shim, self.stage = shim, args.zero_stage
        timeout = int(float(plan.spec.get("timeout", {}).get("collective_s", 60)) or 60)
        t_init = time.perf_counter()
        deepspeed.init_distributed("gloo", timeout=datetime.timedelta(seconds=timeout))
        import torch.distributed as dist

        self.D = dist.get_world_size()
        if self.D != plan.dp:
            common.fail(f"world {self.D} but the plan has dp={plan.dp}")

        torch.manual_seed(int(plan.spec.get("seed", 0)))
        self.model = model = shim.build_model(torch.float32)
        self.names = [n for n, _ in model.named_parameters()]
        optimizer = common.optimizer_for(model.parameters(), plan)
        self.ga = 1 if args.ga1 else plan.accum
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                    config=engine_config(plan, args, self.ga))
        self.init_s = time.perf_counter() - t_init
        self.step_calls = 0

    def open_loader(self, dataset):
        """The engine's loader (deepspeed_io) over a DistributedSampler(shuffle=False, drop_last=False)."""
        import torch.distributed as dist

        data = self.shim.data
        self.sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=self.D, rank=dist.get_rank(),
                                                           shuffle=False, drop_last=False)
        self.loader = self.engine.deepspeed_io(dataset, data_sampler=self.sampler,
                                               collate_fn=common.collate(data.pad_token, data.ignore_index),
                                               num_local_io_workers=0, pin_memory=False)
        self.device = self.engine.device
        self.params = dict(self.model.named_parameters())

    def grads(self):
        """The reduced gradient, full (safe_get_full_grad), on the CPU."""
        params, out = self.params, {}
        for n in self.names:
            g = safe_get_full_grad(params[n])
            out[n] = torch.zeros_like(params[n], device="cpu") if g is None else g.detach().to("cpu").clone()
        return out

    def full_params(self):
        """The parameters, full (the fp32 master partitions gathered at ZeRO 1-3), on the CPU."""
        params, out = self.params, {}
        for n in self.names:
            p = safe_get_full_fp32_param(params[n]) if self.stage > 0 else None
            out[n] = (params[n] if p is None else p).detach().to("cpu").clone()
        return out

    def timed(self, fn):
        """fn(), its time excluded from the step time (a gather for the artifacts)."""
        t = time.perf_counter()
        v = fn()
        self.shim._excluded += time.perf_counter() - t
        return v

    def microstep(self, batch, scale=None):
        """One microbatch through the engine: forward, the loss, backward, step."""
        engine, shim, ign = self.engine, self.shim, self.shim.data.ignore_index
        inp = batch["input_ids"].to(self.device)
        labels = batch["labels"].to(self.device)
        logits = logits_of(engine(inp))
        shim.tap(batch["sample_id"], logits, labels)
        if scale is None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=ign)
            shim.add_stack_loss(engine.backward(loss))
        else:
            loss = common.loss_sum(logits, labels, ign) * scale
            shim.add_stack_loss(engine.backward(loss, scale_wrt_gas=False))
        boundary = engine.is_gradient_accumulation_boundary()
        if boundary:
            shim.before_step(self.timed(self.grads))
        engine.step()
        self.step_calls += 1
        if boundary:
            if engine.was_step_applied():
                shim.after_step(self.timed(self.full_params))
            else:
                shim.notes.append(f"engine step {shim.steps} skipped (overflow)")
                shim._grads = None


def next_window(it, A: int) -> list:
    """Up to A microbatches from the loader's iterator (fewer at the end of the epoch)."""
    window = []
    for _ in range(A):
        try:
            window.append(next(it))
        except StopIteration:
            break
    return window


def window_count(window: list, ign: int, D: int) -> int:
    """The window's N all-reduced over the ranks (every rank, empty window too); equal microbatch counts checked."""
    import torch.distributed as dist

    cnt = torch.tensor([sum(int((b["labels"] != ign).sum()) for b in window), len(window)],
                       dtype=torch.float64)
    counts = cnt.clone()
    dist.all_reduce(counts)
    lens = [torch.zeros(1, dtype=torch.float64) for _ in range(D)]
    dist.all_gather(lens, cnt[1:].clone())
    if len({int(x.item()) for x in lens}) != 1:
        common.fail(f"ranks hold different numbers of microbatches in a window: {[int(x) for x in lens]}")
    return int(counts[0].item())


def token_global_epoch(loop: EngineLoop, plan, flush: bool, windows_seen: list):
    """One epoch of the manual token-global recipe: per prefetched window N, then S_r,a * D / N per microbatch."""
    it = iter(loop.loader)
    while True:
        # next() by hand: DeepSpeedDataLoader.__iter__ rebuilds its DataLoader, so
        # itertools.islice(loader_iter) would restart the epoch at every window.
        window = next_window(it, plan.accum)
        N = window_count(window, loop.shim.data.ignore_index, loop.D)
        if not window:
            break
        windows_seen.append((len(window), N))
        loop.shim.saw_window_count(N)
        for k, batch in enumerate(window):
            if flush:
                loop.engine.set_gradient_accumulation_boundary(k == len(window) - 1)
            loop.microstep(batch, scale=loop.D / max(N, 1))
        if len(window) < plan.accum:
            break


def run_facts(args, loop: EngineLoop, plan, windows_seen: list) -> list:
    """What the run's notes say: the engine, the data, the steps and the loss recipe."""
    engine, ga = loop.engine, loop.ga
    leftover = (engine.micro_steps - engine.global_steps * ga) if not args.flush else 0
    facts = [f"DeepSpeed {deepspeed.__version__} engine, ZeRO stage {engine.zero_optimization_stage()}, "
             f"config {args.config}" + (", offload_optimizer cpu" if args.offload else "") +
             f", torch {torch.__version__}, accelerator "
             f"{deepspeed.get_accelerator().device_name()}, Gloo",
             "data: engine.deepspeed_io (DeepSpeedDataLoader) with DistributedSampler(shuffle=False, "
             "drop_last=False); initialize(training_data=) would shuffle (seed 0, no set_epoch)",
             f"{len(loop.loader)} microbatches per rank per epoch, {loop.step_calls} engine.step() calls, "
             f"{engine.global_steps} optimizer steps (gradient_accumulation_steps={ga})",
             f"initialize + init_distributed {loop.init_s:.1f}s"]
    if args.token:
        facts.append("manual token-global recipe: loss = S_r,a * D / N_window (N all-reduced over the prefetched "
                     f"window), engine.backward(loss, scale_wrt_gas=False); windows (microbatches, N): {windows_seen}")
        if args.flush:
            facts.append("boundary set by the loop (set_gradient_accumulation_boundary) on every microbatch" +
                         (f"; gradient_accumulation_steps=1: {plan.accum} engine.backward() calls per step"
                          if args.ga1 else ""))
    else:
        facts.append("loss = the microbatch's mean token loss, engine.backward(loss) scales by 1/A")
    if leftover:
        facts.append(f"{leftover} microbatch(es) after the last boundary were backpropagated but never stepped "
                     f"(the engine steps once every {ga} micro-steps: the partial final window is dropped)")
    return facts


def main():
    args = parse_args()
    shim = common.Shim("deepspeed", args.config_name, packages=("deepspeed", "torch"))
    plan, data = shim.plan, shim.data
    if plan.dtype != torch.float32:
        common.skip(f"plan dtype {plan.dtype_name}: DeepSpeed {deepspeed.__version__} has no float64 training "
                    f"(stage 0 asserts on fp64 gradients, ZeRO 1-3 reduce in fp32) and this shim wires "
                    f"float32 only; run gradcert with --dtype float32")
    dataset, epochs = common.epoch_dataset(plan, data, "samples", "shifted", "DeepSpeed")
    loop = EngineLoop(shim, args)
    loop.open_loader(dataset)

    windows_seen = []
    shim._t0 = time.perf_counter()  # update 0's step time starts here, not before initialize()
    for epoch in range(epochs):
        loop.sampler.set_epoch(epoch)
        if not args.token:
            for batch in loop.loader:
                loop.microstep(batch)
            continue
        token_global_epoch(loop, plan, args.flush, windows_seen)

    shim.finish(loop.full_params, notes="; ".join(run_facts(args, loop, plan, windows_seen)))
    common.shutdown()


if __name__ == "__main__":
    main()
