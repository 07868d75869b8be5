"""Model factories: how gradcert builds the user's own PyTorch model.

A factory is named `FILE.py:FUNC` or `module:FUNC`:

    def FUNC(vocab_size: int, max_len: int, *, spec: dict | None = None) -> torch.nn.Module

- `vocab_size`, `max_len`: the plan's `spec.model.vocab` / `spec.model.max_len` (gradcert's
  synthetic tokens lie in [1, vocab_size), sequences are at most max_len long, 0 is the pad).
- `spec` (optional keyword; passed only when FUNC declares a `spec` parameter or
  `**kwargs`): the plan's whole `spec.model` section, for factories that read more sizes
  from it. This is the choice made for the built-in tiny LM (`gradcert.tiny_lm:tiny_lm`):
  it takes d_model / heads / layers / d_ff from `spec` and falls back to module-level
  defaults (`gradcert.tiny_lm.TINY_LM_DEFAULTS`: vocab 32, d_model 16, heads 2, layers 2,
  d_ff 32, max_len 24) for whatever `spec` lacks. No environment variable is read.
- `forward(input_ids[B, T] long)` returns logits `[B, T, V]`, or an object with `.logits`
  (e.g. a Hugging Face `CausalLMOutput`), or a dict with "logits". Position t's logits
  predict the label gradcert gives position t (its labels are already shifted): the model
  must not shift again, and gradcert computes the loss itself (the model's own loss, if
  any, is never used).

`FILE.py` is looked up as given (absolute, or relative to the current directory), then
in the `search_dirs` a caller passes (the adapters pass the run folder), then beside this
package (backends/python/). A file already imported (same path) is reused; `module:FUNC`
imports an installed module (the built-in `gradcert.tiny_lm:tiny_lm` is the very class the
adapters wrap).

FSDP units (which submodules the FSDP adapters shard as units, besides the root): FUNC's
model may define `gradcert_units(self) -> list[nn.Module]`; otherwise every child of the
outermost `nn.ModuleList`s (the usual `layers` / `blocks` / `h` list of a transformer);
with neither, the root alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys

import torch.nn as nn

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # backends/python
BUILTIN = "gradcert.tiny_lm:tiny_lm"


class FactoryError(ValueError):
    """A factory that cannot be loaded or called, or a model it builds that breaks the
    contract; the message names the factory string."""


def _load_file(factory: str, file: str, search_dirs) -> object:
    tried = []
    candidates = [file] if os.path.isabs(file) else [os.path.abspath(file)] + [
        os.path.join(d, file) for d in list(search_dirs) + [HERE]]
    path = None
    for c in candidates:
        tried.append(c)
        if os.path.isfile(c):
            path = os.path.realpath(c)
            break
    if path is None:
        raise FactoryError(f"model factory '{factory}': file '{file}' not found (looked at: {', '.join(tried)})")
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and os.path.realpath(f) == path:
            return mod
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem not in sys.modules else f"gradcert_factory_{stem}_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FactoryError(f"model factory '{factory}': cannot import '{path}'")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    d = os.path.dirname(path)
    if d not in sys.path:
        sys.path.append(d)  # so the file can import its siblings
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        del sys.modules[name]
        raise FactoryError(f"model factory '{factory}': importing '{path}' raised {type(e).__name__}: {e}") from e
    return mod


def resolve(factory: str | None, search_dirs=()):
    """The factory function named by `factory` (None or "" = the built-in tiny LM)."""
    factory = factory or BUILTIN
    where, sep, func = factory.rpartition(":")
    if not sep or not where or not func:
        raise FactoryError(f"model factory '{factory}': expected FILE.py:FUNC or module:FUNC")
    if where.endswith(".py") or os.sep in where or "/" in where:
        mod = _load_file(factory, where, search_dirs)
    else:
        try:
            mod = importlib.import_module(where)
        except Exception as e:
            raise FactoryError(f"model factory '{factory}': cannot import module '{where}': "
                               f"{type(e).__name__}: {e}") from e
    fn = getattr(mod, func, None)
    if fn is None:
        raise FactoryError(f"model factory '{factory}': '{where}' has no '{func}'")
    if not callable(fn):
        raise FactoryError(f"model factory '{factory}': '{func}' is a {type(fn).__name__}, not callable")
    return fn


def _takes_spec(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "spec" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def build(factory: str | None, vocab_size: int, max_len: int, spec: dict | None = None, search_dirs=()) -> nn.Module:
    """Calls the factory; the module it returns, in its own dtype (callers cast)."""
    name = factory or BUILTIN
    fn = resolve(factory, search_dirs)
    try:
        model = fn(vocab_size, max_len, spec=spec) if _takes_spec(fn) else fn(vocab_size, max_len)
    except Exception as e:
        raise FactoryError(f"model factory '{name}'({vocab_size}, {max_len}) raised {type(e).__name__}: {e}") from e
    if not isinstance(model, nn.Module):
        raise FactoryError(f"model factory '{name}' returned {type(model).__name__}, not a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise FactoryError(f"model factory '{name}': the model has no parameters")
    return model


def build_from_spec(model_spec: dict, search_dirs=(), factory: str | None = None) -> nn.Module:
    """The model of a plan's `spec.model` section (its `factory`, else the built-in)."""
    return build(factory or model_spec.get("factory"), int(model_spec["vocab"]), int(model_spec["max_len"]),
                 spec=model_spec, search_dirs=search_dirs)


def logits_of(output, factory: str | None = None):
    """The logits of a forward's output: a tensor, `.logits`, or a dict's "logits"."""
    if hasattr(output, "logits"):
        output = output.logits
    elif isinstance(output, dict) and "logits" in output:
        output = output["logits"]
    if not hasattr(output, "dim"):
        raise FactoryError(f"model factory '{factory or BUILTIN}': forward returned {type(output).__name__}; "
                           "expected logits [B, T, V] or an object with .logits")
    return output


def check_logits(logits, batch: int, length: int, vocab: int, factory: str | None = None):
    if logits.dim() != 3 or tuple(logits.shape) != (batch, length, vocab):
        raise FactoryError(f"model factory '{factory or BUILTIN}': forward returned logits of shape "
                           f"{list(logits.shape)}, expected [{batch}, {length}, {vocab}] (B, T, vocab)")


def units(model: nn.Module) -> list:
    """The submodules the FSDP adapters shard as units (see the module docstring)."""
    own = getattr(model, "gradcert_units", None)
    if callable(own):
        return list(own())
    out = []

    def walk(m):
        for child in m.children():
            if isinstance(child, nn.ModuleList):
                out.extend(child.children())
            else:
                walk(child)

    walk(model)
    return out
