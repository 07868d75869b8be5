"""A DeepSpeed engine under `gradcert observe`: `gradcert.watch(engine, engine.optimizer)` (NOTE [DeepSpeed engine]).

NOTE [DeepSpeed engine] The engine steps its torch optimizer on flat fp32 partitions (ZeRO 1-3),
possibly on the CPU (offload_optimizer), and decides the accumulation boundary itself; so the
recorder does not hook the torch optimizer but wraps `engine.step`: at a call where
`engine.is_gradient_accumulation_boundary()` holds it records the reduced gradient before the
engine clips (`deepspeed.utils.safe_get_full_grad`: p.grad at stage 0, the gathered fp32
partitions at 1-3; the engine clips inside step() by its `gradient_clipping`, which is recorded as
the job's max norm), and after the step, where `engine.was_step_applied()`, the parameters
(`safe_get_full_fp32_param`: the fp32 master, gathered; the module's own at stage 0). Every one of
these is a collective at stage 3: every rank calls engine.step() at the same boundary. Parameter
names are the engine's module's own. DeepSpeed trains no float64 (stage 0 asserts on fp64
gradients, ZeRO 1-3 reduce in fp32): its jobs are held to float32's tolerance.
"""

from __future__ import annotations

import torch


def _is_engine(obj) -> bool:
    return type(obj).__name__ in ("DeepSpeedEngine", "PipelineEngine") and hasattr(obj, "module")


def _steps_through_deepspeed(optimizer) -> bool:
    """An optimizer of DeepSpeed's (a ZeRO optimizer), or a wrapper of one (accelerate's
    DeepSpeedOptimizerWrapper, as HF Trainer's callbacks see it)."""
    for _ in range(4):
        if optimizer is None:
            return False
        if type(optimizer).__module__.startswith("deepspeed.") or type(optimizer).__name__ == "DeepSpeedOptimizerWrapper":
            return True
        optimizer = getattr(optimizer, "optimizer", None)
    return False


def engine_of(model, optimizer=None):
    """The DeepSpeedEngine (or PipelineEngine) the job trains, or None. Either the engine itself
    was passed to watch(), or (NOTE [engine of a module]) the engine's module with DeepSpeed's
    optimizer: HF Trainer's callbacks get the Trainer's `model` (the module inside the engine)
    and accelerate's wrapper of the engine's optimizer, and the engine is the one that holds it.

    NOTE [engine of a module] Nothing a callback is handed points at the engine, so it is found
    among the live objects (gc): the one DeepSpeedEngine whose `.module` is the watched model."""
    if _is_engine(model):
        return model
    if not _steps_through_deepspeed(optimizer):
        return None
    import gc

    engines = [o for o in gc.get_objects() if _is_engine(o) and getattr(o, "module", None) is model]
    if len(engines) != 1:
        from .observe import ObserveError

        raise ObserveError(f"gradcert.watch: the optimizer is DeepSpeed's ({type(optimizer).__name__}) but "
                           f"{len(engines)} DeepSpeed engines hold the watched model: pass the engine itself, "
                           f"gradcert.watch(engine, engine.optimizer)")
    return engines[0]


def full_shape(p: torch.Tensor) -> tuple:
    """A parameter's full shape (ZeRO-3 keeps an empty local tensor and the shape in ds_shape)."""
    return tuple(getattr(p, "ds_shape", None) or p.shape)


def full_grads(engine, params: dict) -> dict:
    from deepspeed.utils import safe_get_full_grad

    out = {}
    for n, p in params.items():
        g = safe_get_full_grad(p) if p.requires_grad else None
        out[n] = torch.zeros(full_shape(p), dtype=p.dtype) if g is None else g.detach().to("cpu", p.dtype).clone()
    return out


def full_params(engine, params: dict) -> dict:
    from deepspeed.utils import safe_get_full_fp32_param

    stage = engine.zero_optimization_stage()
    out = {}
    for n, p in params.items():
        q = safe_get_full_fp32_param(p) if stage > 0 and p.requires_grad else None
        if q is None and stage == 3:
            from deepspeed.runtime.zero.partition_parameters import GatheredParameters

            with GatheredParameters([p]):
                q = p.detach().clone()
        out[n] = (p if q is None else q).detach().to("cpu", p.dtype).clone()
    return out


def group_names(engine, optimizer, names_by_id: dict) -> list:
    """Per param group of the torch optimizer the engine steps, the model parameters in it: the
    ZeRO optimizer keeps the model's own groups (bit16_groups at 1-2, fp16_groups at 3)."""
    zero = engine.optimizer
    groups = getattr(zero, "bit16_groups", None) or getattr(zero, "fp16_groups", None)
    out = []
    for i, g in enumerate(optimizer.param_groups):
        own = [names_by_id[id(p)][0] for p in g["params"] if id(p) in names_by_id]
        if not own and groups is not None and i < len(groups):
            own = [names_by_id[id(p)][0] for p in groups[i] if id(p) in names_by_id]
        out.append(own)
    if len(out) == 1 and not out[0]:
        out[0] = [ns[0] for ns in names_by_id.values()]
    return out


def wrap_step(engine, observer):
    """engine.step with the recorder around the boundary's step (see the NOTE)."""
    original = engine.step

    def step(*args, **kwargs):
        boundary = not observer._ended and engine.is_gradient_accumulation_boundary()
        if boundary:
            clip = float(engine.gradient_clipping() or 0.0)
            observer.clip = {"max_norm": clip, "total_norm": None} if clip > 0 else None
            observer._pre_step(observer.optimizer, args, kwargs)
        out = original(*args, **kwargs)
        if boundary:
            if engine.was_step_applied():
                observer._post_step(observer.optimizer, args, kwargs)
            else:
                observer.fail("the DeepSpeed engine skipped its step (a loss-scale overflow): gradcert certifies "
                              "applied steps; run the job in float32 or bfloat16 without fp16 loss scaling")
        return out

    engine.step = step
    return lambda: setattr(engine, "step", original)
