"""gradcert shim: PyTorch's own pipeline parallelism (`torch.distributed.pipelining`) under
torchrun on Gloo (CPU).

    torchrun --nproc_per_node=$GRADCERT_NPROC --master_addr=127.0.0.1 \\
             --master_port=$GRADCERT_MASTER_PORT backends/python/stacks/torch_pp.py --config NAME

    gradcert run --backend external --world 2 --pp 2 ...     (dp 1 x pp 2)

This is real PyTorch PP: manual `PipelineStage`s (one per rank) driven by PyTorch's own
schedules `ScheduleGPipe` / `Schedule1F1B`, which split the batch into microbatches
(`torch.tensor_split` on dim 0), send activations / gradients between the stages (P2P
isend / irecv, `batch_isend_irecv` for mixed batches), call the loss_fn on the last stage
per microbatch, backpropagate, and (scale_grads=True, the default) divide the stage's
gradients by n_microbatches. PyTorch has no trainer: the loop is the user's own (per window:
zero_grad, schedule.step(batch) / step(target=..., losses=...), optimizer.step()).

The split (the tiny LM of gradcert/tiny_lm.py only): stage s of pp holds blocks
[s L/pp, (s+1) L/pp); stage 0 also wte, wpe; the last stage also ln_f, lm_head. The stage
modules keep the canonical attribute names (blocks is a ModuleDict keyed by the original
block index), so their named_parameters() are the canonical names; the full gradient and
parameters are all_gather_object'ed (every rank calls, outside the timed step) and rank 0
writes them. Each stage has its own torch optimizer over its own parameters.

Mapping the plan onto the schedule: one optimizer window of a DP rank = one
`schedule.step()`, n_microbatches = A (the plan's accumulation steps), microbatch a = the
plan's slot a. The schedule requires (torch 2.13):
  - at least n_microbatches rows in the batch, else (before any communication) the first
    stage raises `ValueError: Expecting 3 arg_mbs but got 2` (split_args_kwargs_into_chunks
    makes min(rows, n_microbatches) chunks, then _check_inputs) and the last stage, which
    splits the target, `AssertionError: Tensor size 2 is smaller than num_chunks`
    (microbatch._split_tensor) (A = 3, a partial window of 2 examples); NOTE [short batch];
  - the same shape for every microbatch and every step: the stage infers its P2P buffers'
    shapes once (metadata inference on the first step, from the first microbatch). Probed
    with `--pad window` (each window padded to its own longest, what a DataLoader's collate
    gives): update 1 (T 19 after update 0's 24) is received on the last stage into the
    first step's [2, 24, 16] buffer without any error from Gloo, and fails only in the loss,
    `ValueError: Expected input batch_size (48) to match target batch_size (38).` (the rank
    then dies; stage 0 sees "Connection closed by peer").
So a user must give the schedule equal, static microbatches: the shim pads every sequence to
the spec's max_len (right padding: the loss and, with the causal mask, the real positions'
activations are the protocol's; only BLAS blocking may differ in the last bit) and every
slot to B_micro rows with rows without targets (pad tokens, ignore_index labels; zero loss,
zero gradient). Empty slots (the partial final window) are B_micro such rows.

Configurations (--config):
  gpipe, 1f1b   the correct recipe: loss_fn = sum CE * D / N (N the window's valid targets,
                all-reduced over the DP group; D = 1 here), scale_grads=False (the docs:
                "should match the configuration of your loss_fn ... sum losses
                (scale_grads=False)"), padded equal slots (above).
  gpipe-default, 1f1b-default   the documented default usage: loss_fn = F.cross_entropy
                (mean over the microbatch's valid targets, ignore_index), scale_grads=True
                (the schedule divides by n_microbatches): a mean of per-microbatch means
                (micro-mean). The batch is the window's real examples only (what a
                DataLoader of B_micro x A gives; padded to max_len), split by the schedule:
                a partial final window with fewer than A examples is refused by the schedule
                (the errors above); the loop catches them and does not step (the
                update is written as "no step"), which is what gradcert then diagnoses.

What runs on CPU / Gloo (torch 2.13.0+cpu): everything used here — manual PipelineStage on
device cpu, the warm-up vote and DYNAMIC metadata inference (send_object_list /
recv_object_list), ScheduleGPipe and Schedule1F1B with their P2P (isend / irecv,
batch_isend_irecv) over Gloo; gpipe and 1f1b certify exact in float64 (grad.parity
~1.5e-15). Pitfall met on the way: a schedule built with loss_fn=None on the non-last
stages has no backward there (PipelineScheduleSingle: _has_backward = loss_fn is not None)
and the run deadlocks (Gloo "Timed out waiting 30000ms for send operation to complete"):
pass the loss_fn on every stage, as the docs do. Only dp = 1 (PP alone):
DP x PP would need the user's own gradient all-reduce over the DP group (or FSDP/DDP per
stage), not done here. float64 / float32 only. Clipping (max_grad_norm > 0): the norm is the
global one, all-reduced over the stages (torch.nn.utils.get_total_norm per stage, squares
summed over the PP group, clip_grads_with_norm_), after the gradient is captured.
"""

import argparse
import os
import sys
import time
from datetime import timedelta

import common  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # noqa: E402
except Exception as e:  # pragma: no cover - environment problem
    common.skip(f"torch.distributed.pipelining cannot be imported: {e}")

CONFIGS = ("gpipe", "1f1b", "gpipe-default", "1f1b-default")
STACK = "torch-pp"


class Stage(nn.Module):
    """Stage s of the tiny LM, with the canonical names (TinyLM.forward, split)."""

    def __init__(self, model, lo, hi, first, last):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.wte, self.wpe = model.wte, model.wpe
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(lo, hi)})
        if last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x):
        if self.first:
            T = x.size(1)
            pos = torch.arange(T, dtype=torch.long)
            x = self.wte(x) + self.wpe(pos).unsqueeze(0)
        for b in self.blocks.values():
            x = b(x)
        if self.last:
            x = self.lm_head(self.ln_f(x))
        return x


def parse_args():
    """The command line: --config and --pad."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=CONFIGS, default="gpipe")
    ap.add_argument("--pad", choices=("max_len", "window"), default="max_len",
                    help="pad sequences to the spec's max_len (static shapes, default) or to the window's longest "
                         "(what a DataLoader's collate gives; probes the schedule's static-shape requirement)")
    return ap.parse_args()


def check_plan(plan):
    """Fails on a topology or dtype the shim does not run: PP only (tp 1, dp 1, pp >= 2), no bfloat16."""
    if plan.tp != 1:
        common.fail(f"the torch PP shim has no tensor parallelism; the plan has tp={plan.tp}")
    if plan.pp < 2:
        common.fail(f"the plan has pp={plan.pp}; run with --pp 2 (or more)")
    if plan.dp != 1:
        common.fail(f"the torch PP shim is PP only (dp 1); the plan has dp={plan.dp}: run with --world {plan.pp}")
    if plan.dtype == torch.bfloat16:
        common.fail("bfloat16 needs fp32 master weights the shim does not keep: run float64 or float32")


def init_stages(plan) -> int:
    """The Gloo process group; the world checked against pp; returns the world size."""
    timeout = float(plan.spec.get("timeout", {}).get("collective_s", 60)) or 60.0
    dist.init_process_group(backend="gloo", init_method="env://", timeout=timedelta(seconds=timeout))
    world = dist.get_world_size()
    if world != plan.pp:
        common.fail(f"started with world {world}, the plan's topology needs pp = {plan.pp}")
    return world


def split_model(shim, s: int, pp: int):
    """This rank's Stage of the plan's tiny LM and the block cuts of every stage."""
    torch.manual_seed(int(shim.plan.spec.get("seed", 0)))
    model = shim.build_model()
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(model, n) for n in ("wte", "wpe", "ln_f", "lm_head")):
        common.fail("the torch PP shim splits the tiny LM (gradcert.tiny_lm:tiny_lm): wte, wpe, blocks, ln_f, lm_head")
    L = len(blocks)
    if L < pp:
        common.fail(f"{L} blocks cannot fill {pp} stages")
    cuts = [round(k * L / pp) for k in range(pp + 1)]
    stage_mod = Stage(model, cuts[s], cuts[s + 1], s == 0, s == pp - 1)
    del model
    return stage_mod, cuts


def make_loss_fn(correct: bool, ign: int, D: int, N_box: list, seen: list):
    """The schedule's loss_fn: sum CE * D / N_box[0] (correct) or the mean CE; keeps every call in `seen`."""

    def loss_correct(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=ign,
                               reduction="sum") * D / N_box[0]

    def loss_default(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=ign)

    base_loss = loss_correct if correct else loss_default

    def loss_fn(logits, target):
        # NOTE [metadata inference] on its first step the last stage calls loss_fn once more,
        # on the first microbatch, to infer the backward metadata (stage.py
        # _backward_metadata_inference, autograd w.r.t. the stage inputs only): the shim keeps
        # every call and taps the last A (the schedule's microbatches, in order).
        loss = base_loss(logits, target)
        seen.append((logits.detach(), target, loss.detach()))
        return loss

    return loss_fn


def make_schedule(stage_mod, s: int, pp: int, config: str, A: int, loss_fn, correct: bool):
    """PipelineStage and the config's schedule (GPipe or 1F1B); skips where CPU/Gloo cannot build them."""
    try:
        stage = PipelineStage(stage_mod, s, pp, torch.device("cpu"))
        Sched = ScheduleGPipe if config.startswith("gpipe") else Schedule1F1B
        # loss_fn on every stage: a schedule without one has no backward (_has_backward = loss_fn is not None)
        return Sched(stage, n_microbatches=A, loss_fn=loss_fn, scale_grads=not correct)
    except Exception as e:
        common.skip(f"PipelineStage / {config} schedule on CPU/Gloo: {type(e).__name__}: {e}")


def attach_capture(shim, optimizer, stage_mod, world: int, plan):
    """The shim's step hooks (full gradient / parameters gathered), then clipping; returns the params function."""

    def gather(d):
        t0 = time.perf_counter()
        everyone = [None] * world
        dist.all_gather_object(everyone, {n: t.detach().cpu() for n, t in d.items()})
        out = {}
        for part in everyone:
            out.update(part)
        shim._excluded += time.perf_counter() - t0
        return out

    def grads():
        return gather({n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in stage_mod.named_parameters()})

    def params():
        return gather({n: p for n, p in stage_mod.named_parameters()})

    shim.attach(optimizer, grads, params)  # capture first, then clip (pre-clip artifact)
    if plan.max_grad_norm > 0:
        def clip(*_):
            ps = [p for p in stage_mod.parameters() if p.grad is not None]
            local = torch.nn.utils.get_total_norm([p.grad for p in ps], 2.0, foreach=False).to(torch.float64)
            sq = local ** 2
            dist.all_reduce(sq)
            torch.nn.utils.clip_grads_with_norm_(ps, plan.max_grad_norm, sq.sqrt(), foreach=False)
        optimizer.register_step_pre_hook(clip)
    return params


def rows(data, ids, T):
    """The batch of `ids` right-padded to T (None: a row without targets): (input, labels)."""
    pad, ign = data.pad_token, data.ignore_index
    inp = torch.full((len(ids), T), pad, dtype=torch.long)
    lab = torch.full((len(ids), T), ign, dtype=torch.long)
    for i, x in enumerate(ids):
        if x is None:
            continue  # a row without targets
        r = data._row(x)
        n = len(r["tokens"])
        inp[i, :n] = torch.tensor(r["tokens"], dtype=torch.long)
        lab[i, :n] = torch.tensor(r["labels"], dtype=torch.long)
    return inp, lab


def window_layout(slots, real, correct: bool, A: int, B: int):
    """(the batch's ids, None a padding row; the ids per schedule microbatch) of the config's window layout."""
    if correct:
        layout = [list(ids) + [None] * (B - len(ids)) for ids in slots]  # equal slots of B rows
        return [i for ids in layout for i in ids], [list(ids) for ids in slots]
    parts = torch.tensor_split(torch.arange(len(real)), A) if len(real) >= A else []
    return real, [[real[j] for j in p.tolist()] for p in parts]


def window_batch(data, slots, pad: str, max_len: int, correct: bool, A: int, B: int):
    """The window's examples, its N, the ids per schedule microbatch and the padded batch (input, labels)."""
    real = [i for ids in slots for i in ids]
    n_r = torch.tensor([float(data.valid_targets(real))], dtype=torch.float64)  # D = 1: no DP group to reduce
    N = int(round(float(n_r.item())))
    T = max_len if pad == "max_len" else max(1, max((len(data._row(i)["tokens"]) for i in real), default=1))
    ids_flat, chunk_ids = window_layout(slots, real, correct, A, B)
    inp, lab = rows(data, ids_flat, T)
    return real, N, chunk_ids, inp, lab


def step_schedule(schedule, first: bool, last: bool, inp, lab):
    """One schedule.step() of this stage; the last stage's losses (None elsewhere)."""
    losses = [] if last else None
    if first:
        schedule.step(inp)
    elif last:
        schedule.step(target=lab, losses=losses)
    else:
        schedule.step()
    return losses


def tap_window(shim, u: int, A: int, last: bool, chunk_ids, seen):
    """gradcert's S on the stack's logits (last stage) or the ids alone, per schedule microbatch."""
    if last:
        if len(seen) < A:
            common.fail(f"update {u}: the schedule called loss_fn {len(seen)} times for {A} microbatches")
        for ids, (logits, target, loss) in zip(chunk_ids, seen[-A:]):
            shim.tap(ids, logits, target)  # gradcert's S on the stack's logits (rows without targets add 0)
            shim.add_stack_loss(loss)
    else:
        for ids in chunk_ids:
            shim.tap(ids, None, None)


def share_last_stage(shim, last: bool, losses, N: int, correct: bool):
    """The last stage's S and loss to every stage (all_reduce), and the window's N where the loss uses it."""
    # the last stage's S and loss to every stage (rank<g>.json of every stage carries the DP rank's S)
    t = torch.tensor([shim.S_r if last else 0.0, (sum(float(x.detach().double()) for x in losses)
                                                  if last else 0.0)], dtype=torch.float64)
    dist.all_reduce(t)
    shim.S_r = float(t[0])
    shim.saw_window_count(N if correct else None)
    shim.pending_loss = float(t[1]) if correct else None


def check_refused(refused: list, plan):
    """Fails unless the refused windows are the last ones (the partial one)."""
    if refused:
        # NOTE: a refused window comes last (the partial one); common.Shim writes it as no step
        if any(int(r.split()[1].rstrip(":")) != len(plan) - len(refused) + k for k, r in enumerate(refused)):
            common.fail(f"the schedule refused a window that is not the last: {refused}")


def main():
    args = parse_args()
    shim = common.Shim(STACK, args.config, packages=("torch",))
    plan, data, run = shim.plan, shim.data, shim.run
    correct = not args.config.endswith("-default")
    check_plan(plan)
    world = init_stages(plan)
    pp, s = plan.pp, dist.get_rank()  # dp 1: the stage index is the global rank
    first, last = s == 0, s == pp - 1
    stage_mod, cuts = split_model(shim, s, pp)
    names = [n for n, _ in stage_mod.named_parameters()]

    D, A, B = plan.dp, plan.accum, plan.micro
    max_len = int(plan.model_spec.get("max_len", 0)) or max(len(r["tokens"]) for r in data.samples.values())
    N_box = [1]
    seen = []  # (logits, target, loss) of every loss_fn call of this step
    loss_fn = make_loss_fn(correct, data.ignore_index, D, N_box, seen)
    schedule = make_schedule(stage_mod, s, pp, args.config, A, loss_fn, correct)
    optimizer = common.optimizer_for(stage_mod.parameters(), plan)
    params = attach_capture(shim, optimizer, stage_mod, world, plan)

    consumed = run.consumed(shim.dp_rank)
    refused = []
    for u in range(len(plan)):
        # chunk_ids: this step's ids per schedule microbatch
        real, N, chunk_ids, inp, lab = window_batch(data, consumed[u], args.pad, max_len, correct, A, B)
        N_box[0] = N if N > 0 else 1
        seen.clear()
        optimizer.zero_grad(set_to_none=True)
        try:
            losses = step_schedule(schedule, first, last, inp, lab)
        except (AssertionError, ValueError) as e:
            if "smaller than num_chunks" not in str(e) and "arg_mbs but got" not in str(e):
                raise
            # NOTE [short batch] every stage refuses the batch before any communication (the
            # first stage's args split into min(rows, A) chunks, then _check_inputs: ValueError
            # "Expecting A arg_mbs but got rows"; the last stage's target: _split_tensor's
            # AssertionError "Tensor size rows is smaller than num_chunks"): the loop cannot step
            refused.append(f"update {u}: {len(real)} examples for n_microbatches={A}: "
                           f"stage {s}: {type(e).__name__}: {e}")
            shim.micro = []
            shim.S_r, shim.stack_loss = 0.0, 0.0
            continue
        tap_window(shim, u, A, last, chunk_ids, seen)
        share_last_stage(shim, last, losses, N, correct)
        optimizer.step()
        if shim.steps != u + 1 - len(refused):
            common.fail("the optimizer hooks did not record this step")
    check_refused(refused, plan)

    facts = [f"torch {torch.__version__} pipelining: manual PipelineStage x {pp}, "
             f"{'ScheduleGPipe' if args.config.startswith('gpipe') else 'Schedule1F1B'}, n_microbatches={A}, "
             f"scale_grads={not correct}, Gloo P2P",
             f"stage {s}: {len(names)} parameters, blocks {cuts[s]}..{cuts[s + 1] - 1}",
             "loss_fn sum CE * D / N; slots padded to B_micro rows without targets"
             if correct else "loss_fn mean CE per microbatch; the window's examples split by the schedule",
             f"sequences padded to {'max_len ' + str(max_len) if args.pad == 'max_len' else 'the window longest'}"]
    facts += refused
    shim.finish(params, notes="; ".join(facts))
    common.shutdown()


if __name__ == "__main__":
    main()
