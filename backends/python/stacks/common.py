"""Shared code of the real-stack shims (backends/python/stacks/): what every shim needs to
feed a third-party trainer the plan's examples through the trainer's **own** data path and
to hand gradcert what the trainer really did, through gradcert/ref/client.py.

A shim never trains by hand. It gives the stack:
  - a map-style dataset whose index i is the i-th example of `global_order(plan, kind)`, each
    item {"input_ids", "labels" (the stack's label convention), "sample_id"}; the stack's
    own sampler / sharding / loader decides who gets what (and pads, drops or duplicates
    as it does by default);
  - the plan's model (spec.model.factory, loaded from initial.safetensors), optimizer
    hyperparameters and accumulation steps, in the stack's own configuration language.
It observes, without changing the math:
  - at every forward: the sample ids the stack fed the model (`Shim.tap`), and the loss
    sum S of that microbatch with gradcert's loss on the stack's logits (rank<g>.json);
  - just before every optimizer step: the reduced gradient (`Shim.before_step`), and just
    after it the parameters (`Shim.after_step`); a stack that shards them passes gather
    functions (every rank calls them).
The update windows are the stack's: an update ends where the stack steps. If the stack
steps fewer times than the plan has updates (e.g. it drops a partial final window), the
missing updates are written as "no step": zero gradient, unchanged parameters, nothing
consumed, so gradcert's checks and diagnosis say so; extra steps are reported in the notes.

NOTE [stack sampler audit] Because the stack decides the sharding, scripts/certify-stacks runs
every shim under `gradcert run --sampler-audit`: the ledger and the update size are checked
against the plan (a duplicated, dropped or carried-over example is a finding), the gradients
against a reference over the ids the stack really consumed (so its math is judged on its
own data). The shims behave the same under GRADCERT_SAMPLER=plan.

NOTE [stack figures] The manifest's `loss` and `valid_targets` are what the stack itself used
where it exposes them (e.g. HF Trainer's num_items_in_batch), else null ("not exposed"):
gradcert then skips loss.global_mean / targets.window_count for that update rather than
check a figure the shim made up. rank<g>.json carries `loss_sum` (gradcert's loss on the
stack's own logits, checked by ranks.local_sums) but no `valid_targets` (the shim's own
recount would check nothing).
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The test bed (backends/python/testbed/: the adapters' trainer, whose optimizer the shims share)
# is not installed with the gradcert package: its folder, the shims' parent, goes on the path
# (after the installed packages, so the venv's gradcert is the one imported).
if os.path.dirname(HERE) not in sys.path:
    sys.path.append(os.path.dirname(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gradcert.ref import client  # noqa: E402
from gradcert.ref import factory as factory_mod  # noqa: E402

EXIT_SKIP = 77


def fail(msg: str, code: int = 2):
    print(f"gradcert stack shim: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def skip(msg: str):
    """This stack cannot run here (a missing package, no GPU): exit 77 naming why."""
    fail(f"SKIP: {msg}", EXIT_SKIP)


def global_order(plan: client.Plan, kind: str) -> list:
    """The plan's ids in the order a stack's sequential sampler must yield them for the
    stack's own sharding to give DP rank r the plan's slots[r][a] in every full window:

    kind "batches": global microbatch j (B_micro examples) goes to DP rank j mod D
      (accelerate's BatchSamplerShard: HF Trainer, accelerate's prepared loaders);
    kind "samples": example i goes to DP rank i mod D, which then batches its own
      (torch DistributedSampler(shuffle=False): Lightning, DeepSpeed's loader).

    A partial window's ids follow in the plan's window order: how the stack shards (and
    pads) them is what certify-stacks reports."""
    if kind not in ("batches", "samples"):
        raise ValueError(f"global_order kind {kind!r}: expected 'batches' or 'samples'")
    order = []
    for u, w in enumerate(plan.windows):
        slots = w["slots"]
        full = not plan.partial(u) and all(len(slots[r][a]["ids"]) == plan.micro
                                          for r in range(plan.dp) for a in range(plan.accum))
        if not full:
            order += [int(i) for i in w["ids"]]
            continue
        for a in range(plan.accum):
            if kind == "batches":
                for r in range(plan.dp):
                    order += [int(i) for i in slots[r][a]["ids"]]
            else:
                for i in range(plan.micro):
                    for r in range(plan.dp):
                        order.append(int(slots[r][a]["ids"][i]))
    return order


def epoch_dataset(plan: client.Plan, dataset: client.Dataset, kind: str, labels: str, stack: str):
    """The dataset a stack's sequential sampler iterates once per epoch (global_order of one
    epoch) and the number of epochs; refuses plans a data-parallel stack shim cannot feed
    (TP / PP, partial epochs, epochs in different orders), naming `stack`."""
    if plan.tp != 1 or plan.pp != 1:
        fail(f"the {stack} shim is data parallel only; the plan has tp={plan.tp} pp={plan.pp}")
    if len(plan) % plan.windows_per_epoch:
        fail(f"the plan has {len(plan)} updates, not whole epochs of {plan.windows_per_epoch}")
    epochs = len(plan) // plan.windows_per_epoch
    order = global_order(plan, kind)
    n = len(order) // epochs
    if any(order[e * n:(e + 1) * n] != order[:n] for e in range(epochs)):
        fail(f"the plan orders its epochs differently; {stack}'s sequential sampler repeats one order")
    return PlanDataset(dataset, order[:n], labels=labels), epochs


class PlanDataset(torch.utils.data.Dataset):
    """Index i -> the i-th example of the order: {"input_ids", "labels", "sample_id"}.

    labels="shifted": gradcert's (labels[t] is the target of position t).
    labels="hf": the Hugging Face causal-LM convention the model's own loss shifts:
      NOTE [HF labels] labels_hf[t] = tokens[t] wherever position t-1 has a target, and
      labels_hf[0] = tokens[0] in a row with any target (what `labels = input_ids.clone()`
      with prompt and padding set to -100 gives). Shifting back gives exactly gradcert's
      targets; counting labels_hf != -100 *unshifted* counts one extra per such row (the
      unshifted-count bug class)."""

    def __init__(self, dataset: client.Dataset, order: list, labels: str = "shifted"):
        if labels not in ("shifted", "hf"):
            raise ValueError(f"labels {labels!r}: expected 'shifted' or 'hf'")
        self.data, self.order, self.labels = dataset, list(order), labels

    def __len__(self):
        return len(self.order)

    def __getitem__(self, i):
        s = self.data._row(self.order[i])
        tokens, lab = list(s["tokens"]), list(s["labels"])
        ign = self.data.ignore_index
        if self.labels == "hf":
            hf = [ign] * len(tokens)
            for t in range(1, len(tokens)):
                if lab[t - 1] != ign:
                    hf[t] = tokens[t]
            if any(x != ign for x in lab):
                hf[0] = tokens[0]
            lab = hf
        return {"input_ids": tokens, "labels": lab, "sample_id": int(s["id"])}


def collate(pad_token: int, ignore_index: int):
    """A collate_fn: right-pads to the longest with pad_token / ignore_index (the protocol's
    microbatch), sample ids as a long tensor."""

    def fn(features):
        T = max(1, max(len(f["input_ids"]) for f in features))
        inp = torch.full((len(features), T), pad_token, dtype=torch.long)
        lab = torch.full((len(features), T), ignore_index, dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            inp[i, :n] = torch.tensor(f["input_ids"], dtype=torch.long)
            lab[i, :n] = torch.tensor(f["labels"], dtype=torch.long)
        return {"input_ids": inp, "labels": lab,
                "sample_id": torch.tensor([int(f["sample_id"]) for f in features], dtype=torch.long)}

    return fn


def shift_hf_labels(labels_hf: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """labels_hf[..., 1:] padded with ignore_index at the end: gradcert's shifted labels."""
    out = torch.full_like(labels_hf, ignore_index)
    out[..., :-1] = labels_hf[..., 1:]
    return out


def loss_sum(logits: torch.Tensor, shifted_labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """gradcert's S: the sum of token cross-entropies over valid (shifted) targets, in the
    logits' dtype (float32 for bf16 logits)."""
    if logits.dtype == torch.bfloat16:
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), shifted_labels.reshape(-1).to(logits.device),
                           ignore_index=ignore_index, reduction="sum")


def optimizer_for(params, plan: client.Plan):
    """torch.optim SGD / AdamW with the plan's hyperparameters (the protocol's rules): the
    adapters' own (testbed/trainer.py make_optimizer, kind 'torch')."""
    from testbed import trainer

    return trainer.make_optimizer(params, plan.optimizer, "torch")


def package_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


class Shim:
    """One rank's observer of a stack's training run; writes the protocol's artifacts."""

    def __init__(self, stack: str, config: str, packages=(), rank: int | None = None, world: int | None = None):
        try:
            self.run = client.Run.from_env()
        except client.ProtocolError as e:
            fail(str(e))
        self.plan, self.data = self.run.plan, self.run.dataset
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
        self.dp_rank = self.plan.dp_rank_of(self.rank)
        self.stack, self.config = stack, config
        self.versions = {p: package_version(p) for p in packages}
        if packages:  # the stack's own package first: what findings name as its version
            self.versions["stack_version"] = f"{packages[0]} {self.versions[packages[0]]}"
        self.backend = f"{stack}[{config}]"
        self.writer = client.ArtifactWriter(self.run.out, self.rank, self.world, self.backend, self.plan.dtype,
                                            self.dp_rank)
        self.micro: list = []  # this window's microbatches so far (ids per forward)
        self.S_r = 0.0
        self.N_seen = None  # the N the stack used in this window, where it exposes one
        self.stack_loss = 0.0  # what the stack backpropagated, summed over the window (rank-local)
        self.pending_loss = None  # the window's global token mean where the loop forms one (else null)
        self.replicated = False  # every rank holds the whole model (DDP): digest it (replicas.agree)
        self._grads = None
        self._consumed = None
        self.steps = 0
        self.extra_steps = 0
        self._t0 = time.perf_counter()
        self._excluded = 0.0  # seconds spent gathering for the artifacts (not step time)
        self.notes: list = []

    # --- model ---------------------------------------------------------------------------
    def build_model(self, dtype: torch.dtype | None = None) -> torch.nn.Module:
        try:
            return self.run.build_model(self.plan.dtype if dtype is None else dtype)
        except (client.ProtocolError, factory_mod.FactoryError) as e:
            fail(str(e))

    # --- observations ---------------------------------------------------------------------
    def tap(self, sample_ids, logits: torch.Tensor | None, shifted_labels: torch.Tensor | None):
        """At every forward the stack runs in training: the ids it fed and gradcert's S of them."""
        ids = [int(x) for x in (sample_ids.tolist() if torch.is_tensor(sample_ids) else sample_ids)]
        self.micro.append(ids)
        if logits is not None and ids:
            with torch.no_grad():
                self.S_r += float(loss_sum(logits.detach(), shifted_labels, self.data.ignore_index).double())

    def saw_window_count(self, n):
        """The N the stack normalises this window by (e.g. num_items_in_batch)."""
        if n is not None:
            self.N_seen = int(n.item() if torch.is_tensor(n) else round(float(n)))

    def add_stack_loss(self, value):
        if value is not None:
            self.stack_loss += float(value.detach().double().sum() if torch.is_tensor(value) else value)

    def before_step(self, grads: dict):
        """The reduced gradient, before the optimizer changes anything (before clipping)."""
        t = time.perf_counter()
        self._grads = {n: g.detach().to("cpu").clone() for n, g in grads.items()}
        self._consumed, self.micro = self.micro, []
        self._excluded += time.perf_counter() - t

    def after_step(self, params: dict):
        t = time.perf_counter()
        if self._grads is None:
            fail("after_step without before_step: the shim did not see the gradient of this step")
        u = self.steps
        self.steps += 1
        if u >= len(self.plan):
            self.extra_steps += 1
        else:
            P = {n: p.detach().to("cpu") for n, p in params.items()}
            step_seconds = max(0.0, t - self._t0 - self._excluded)
            # (NOTE [replica digests]) A shim whose stack keeps a whole replica on every rank
            # (replicated = True: DDP under HF / accelerate / Lightning) digests it after each step.
            self.writer.record(u, self._consumed, self.S_r, None, self.pending_loss, self.N_seen, step_seconds,
                               self._grads, P, extra={"stack_loss": self.stack_loss},
                               replicas=client.replica_digests(P.items()) if self.replicated else None)
        self._grads, self._consumed = None, None
        self.S_r, self.N_seen, self.stack_loss, self.pending_loss = 0.0, None, 0.0, None
        self._excluded = 0.0
        self._t0 = time.perf_counter()  # the next window starts after this bookkeeping

    def attach(self, optimizer, grads_fn, params_fn):
        """Step pre / post hooks on the torch optimizer the stack steps (every rank)."""
        h1 = optimizer.register_step_pre_hook(lambda *_: self.before_step(grads_fn()))
        h2 = optimizer.register_step_post_hook(lambda *_: self.after_step(params_fn()))
        return h1, h2

    # --- the end ---------------------------------------------------------------------------
    def finish(self, params_fn, notes: str = "", extra_versions: dict | None = None):
        """Writes rank<g>.json (and, on rank 0, manifest.json). Updates the stack never
        stepped are written as "no step" (zero gradient, unchanged parameters, nothing
        consumed); `params_fn` gives the final parameters (every rank calls it)."""
        missing = len(self.plan) - min(self.steps, len(self.plan))
        if missing:
            P = {n: p.detach().to("cpu") for n, p in params_fn().items()}
            leftover = self.micro
            for k in range(missing):
                u = self.steps + k
                self.writer.record(u, leftover if k == 0 else [], self.S_r if k == 0 else 0.0, None, None, None, 0.0,
                                   {n: torch.zeros_like(p) for n, p in P.items()}, P,
                                   extra={"stack_loss": 0.0, "no_step": True})
                leftover = []
            self.notes.append(f"the stack made {self.steps} optimizer steps, the plan has {len(self.plan)}: "
                              f"updates {self.steps}..{len(self.plan) - 1} written as no step "
                              f"(zero gradient, unchanged parameters)")
        elif self.micro:
            self.notes.append(f"{len(self.micro)} forwards after the last optimizer step were never stepped")
        if self.extra_steps:
            self.notes.append(f"the stack made {self.extra_steps} more optimizer steps than the plan's "
                              f"{len(self.plan)} (not recorded)")
        v = {k: val for k, val in self.versions.items() if val}
        v.update(extra_versions or {})
        v.update({"stack": self.stack, "config": self.config})
        text = "; ".join([notes] + self.notes) if notes else "; ".join(self.notes)
        self.writer.finish(v, notes=text or None, extra={"stack": self.stack, "config": self.config})


def shutdown():
    """As testbed/trainer.py shutdown (NOTE [teardown]): barrier, destroy, os._exit(0)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
