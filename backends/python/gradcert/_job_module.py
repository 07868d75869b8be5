"""The job's own module, saved at `gradcert.watch` so the reference can rebuild it without a factory.

NOTE [the job's own module] A model that is neither a Hugging Face PreTrainedModel (rebuilt from
its config) nor given a factory is pickled at watch() with cloudpickle: classes defined in the
job's script, or in a file beside it that the reference process could not import, travel by
value (their code); installed packages by name. What is pickled is the module as the job built
it, not as its wrappers left it: FSDP1 / activation-checkpoint wrappers are replaced by the
module they wrap, an FSDP2 module gets its own class back, every hook is dropped, and every
parameter becomes an empty tensor of its full shape on the meta device (the weights come from
initial.safetensors, as for any model); buffers travel as they are; what FSDP1, FSDP2 and ZeRO-3
add to a module (state, process groups, partition registries) is left behind. The reference loads it
with `load` (observed_model.py's build). A module that will not pickle (it holds an open file,
a process group, a lock ...) is said at the run's end, with the one keyword that replaces this:
`gradcert.watch(model, optimizer, factory=FUNC)`.
"""

from __future__ import annotations

import io
import os
import sys
from collections import OrderedDict

import torch
import torch.nn as nn

PICKLE = "observed.module.pkl"
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks_with_kwargs")
_WRAPPED = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")
# What FSDP1 / FSDP2 (composable API state keys) and DeepSpeed ZeRO-3 add to a module's __dict__.
_WRAPPER_STATE_PREFIXES = ("_fsdp", "__composable_api_state_key", "_is_fsdp_managed", "ds_", "_ds_")
_WRAPPER_STATE = ("_is_root", "_handle", "_external_params", "_original_parameters", "all_parameters",
                  "post_bwd_fn", "pre_bwd_fn")


def user_class(module: nn.Module) -> type:
    """The module's own class: FSDP2 swaps in a generated FSDP<Class> subclass."""
    t = type(module)
    if t.__module__.startswith("torch.distributed"):
        t = next((b for b in t.__mro__[1:] if not b.__module__.startswith("torch.distributed")), t)
    return t


def _inner(module: nn.Module) -> nn.Module:
    """Through FSDP1 units and activation-checkpoint wrappers to the module they wrap."""
    for _ in range(8):
        nxt = next((module.__dict__["_modules"][w] for w in _WRAPPED if w in module.__dict__.get("_modules", {})), None)
        if nxt is None or not type(module).__module__.startswith("torch.distributed"):
            return module
        module = nxt
    return module


def _rebuild(cls, state):
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def _meta_parameter(p, full=None):
    """An empty meta-device parameter of the full tensor's shape and dtype (`full`: the recorder's
    full copy of a parameter the job holds sharded; else `p` itself)."""
    like = full if full is not None else p
    return nn.Parameter(torch.empty(tuple(like.shape), dtype=like.dtype, device="meta"), requires_grad=like.requires_grad)


def _state(module: nn.Module, full: dict, prefix: str, metas: dict) -> dict:
    """The module's __dict__ to pickle. `metas` (id of a job parameter -> its meta stand-in) keeps
    a parameter that several modules share (tied embeddings) one parameter in the rebuilt model."""
    state = dict(module.__dict__)
    for name in _HOOK_DICTS:
        if name in state:
            state[name] = OrderedDict()
    params = OrderedDict()
    for n, p in module._parameters.items():
        if n == "_flat_param":
            continue
        if p is not None and id(p) not in metas:
            metas[id(p)] = _meta_parameter(p, full.get(prefix + n))
        params[n] = None if p is None else metas[id(p)]
    # FSDP1 with flat parameters took the module's own parameters out of _parameters (plain
    # tensor attributes stand in for them): put them back from the recorder's full copies.
    for name, t in full.items():
        if name.startswith(prefix) and "." not in name[len(prefix):] and name[len(prefix):] not in params:
            params[name[len(prefix):]] = _meta_parameter(t)
            state.pop(name[len(prefix):], None)
    state["_parameters"] = params
    state["_modules"] = OrderedDict((n, None if m is None else _inner(m)) for n, m in module._modules.items())
    # FSDP1 / FSDP2 / ZeRO-3 state (process groups, hooks, partition registries): not the model's.
    for k in [k for k in state if k.startswith(_WRAPPER_STATE_PREFIXES) or k in _WRAPPER_STATE]:
        state.pop(k)
    return state


def _pickler_class():
    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        """cloudpickle, with every nn.Module reduced to its own class and state (see the NOTE)."""

        def __init__(self, f, full: dict, names: dict):
            super().__init__(f, protocol=4)
            self.full, self.names, self.metas = full, names, {}

        def reducer_override(self, obj):
            if isinstance(obj, nn.Module):
                obj = _inner(obj)
                return _rebuild, (user_class(obj), _state(obj, self.full, self.names.get(id(obj), ""), self.metas))
            return super().reducer_override(obj)

    return Pickler


def _by_value_modules(model: nn.Module, importable) -> list:
    """The modules of the model's classes that the reference process could not import by name."""
    out = []
    for m in model.modules():
        mod = user_class(m).__module__
        if mod in ("__main__", "builtins") or mod in out or mod.startswith(("torch", "transformers", "peft")):
            continue
        if not importable(mod):
            out.append(mod)
    return out


def save(model: nn.Module, out_dir: str, full: dict, importable) -> str:
    """Pickles the job's module into out_dir/observed.module.pkl; returns what to say of it.
    full: canonical parameter name -> the parameter, or a full copy of one the job holds sharded."""
    import cloudpickle

    names = {}
    for prefix, m in model.named_modules():
        names[id(_inner(m))] = _clean(prefix) + "." if prefix else ""
    by_value = _by_value_modules(model, importable)
    for mod in by_value:
        cloudpickle.register_pickle_by_value(sys.modules[mod])
    buf = io.BytesIO()
    try:
        _pickler_class()(buf, full, names).dump(_inner(model))
    finally:
        for mod in by_value:
            cloudpickle.unregister_pickle_by_value(sys.modules[mod])
    with open(os.path.join(out_dir, PICKLE), "wb") as f:
        f.write(buf.getvalue())
    cls = user_class(_inner(model))
    where = "its script" if cls.__module__ == "__main__" else cls.__module__
    return f"the job's own module {cls.__qualname__} (from {where}), pickled at watch()"


def _clean(name: str) -> str:
    return ".".join(p for p in name.split(".") if p not in _WRAPPED and p != "_orig_mod")


def load(path: str) -> nn.Module:
    """The pickled module with real (uninitialised) parameters in place of the meta ones."""
    import pickle

    with open(path, "rb") as f:
        model = pickle.load(f)
    real = {}  # one real parameter per meta one: tied parameters stay tied
    for m in model.modules():
        for n, p in list(m._parameters.items()):
            if p is not None and p.device.type == "meta":
                if id(p) not in real:
                    real[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype), requires_grad=p.requires_grad)
                m._parameters[n] = real[id(p)]
    return model


OBSERVED_MODULE_PY = '''"""The observed job's own module for gradcert's reference runner (written by gradcert.observe)."""
import os

from gradcert._job_module import PICKLE, load


def build(vocab_size, max_len):
    return load(os.path.join(os.path.dirname(os.path.abspath(__file__)), PICKLE))
'''
