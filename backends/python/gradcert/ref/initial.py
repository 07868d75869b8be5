"""initial.safetensors for a factory's model: the model's own parameter names and shapes.

    python -m gradcert.ref.initial --factory F --seed S --dtype D --out FILE
        [--plan plan.json | --vocab V --max-len T] [--scheme gradcert|module]

Scheme `gradcert` (default) is conformance/model/model.cpp's initial_params, applied to any
model: one torch CPU generator seeded with S, the parameters in named_parameters()
order; a normalisation weight (a name containing "ln" that ends in ".weight", as
model.cpp says, or the weight of a LayerNorm / RMSNorm / GroupNorm / BatchNorm module)
is ones; a bias (last name component starting with "bias") is N(0,1) * 0.01; anything
else N(0,1) * 0.2; drawn in float64, then rounded through the run dtype D. For the
built-in tiny LM this reproduces gradcert's own initial.safetensors bit for bit
(tests/test_gradcert.ref.py checks it). Scheme `module`: the module's own
initialisation after torch.manual_seed(S) (the factory is called after seeding).

vocab / max_len come from --plan's spec.model (which may also name the factory), else
--vocab / --max-len (defaults: the spec's, 32 and 24).
"""

from __future__ import annotations

import argparse
import os
import json
import sys

import torch
import torch.nn as nn

from . import client
from . import factory as factory_mod

NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


def _is_norm_weight(name: str, owner: nn.Module) -> bool:
    if "ln" in name and name.endswith(".weight"):
        return True
    return isinstance(owner, NORMS) and name.rsplit(".", 1)[-1] == "weight"


def initial_tensors(model: nn.Module, seed: int, dtype: torch.dtype, scheme: str = "gradcert") -> dict:
    """name -> initial tensor in `dtype` (see the module docstring)."""
    if scheme == "module":
        return {n: p.detach().to(dtype).clone() for n, p in model.named_parameters()}
    if scheme != "gradcert":
        raise ValueError(f"unknown scheme {scheme!r} (gradcert | module)")
    gen = torch.Generator().manual_seed(int(seed))
    owners = {}
    for mname, m in model.named_modules():
        for pname, _ in m.named_parameters(recurse=False):
            owners[f"{mname}.{pname}" if mname else pname] = m
    out = {}
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if _is_norm_weight(name, owners.get(name)):
            init = torch.ones(shape, dtype=torch.float64)
        elif name.rsplit(".", 1)[-1].startswith("bias"):
            init = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.01
        else:
            init = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.2
        out[name] = init.to(dtype)
    return out


def write_initial(factory: str | None, seed: int, dtype_name: str, out: str, vocab: int = 32, max_len: int = 24,
                  model_spec: dict | None = None, scheme: str = "gradcert", search_dirs=()) -> dict:
    if dtype_name not in client.DTYPES:
        raise ValueError(f"dtype {dtype_name!r} is not one of {sorted(client.DTYPES)}")
    if scheme == "module":
        torch.manual_seed(int(seed))
    model = factory_mod.build(factory, vocab, max_len, spec=model_spec, search_dirs=search_dirs)
    tensors = initial_tensors(model, seed, client.DTYPES[dtype_name], scheme)
    client.write_tensors(out, tensors, client.DTYPES[dtype_name],
                         metadata={"factory": factory or factory_mod.BUILTIN, "seed": str(seed), "scheme": scheme})
    return tensors


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gradcert.ref.initial", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--factory", default=None, help="FILE.py:FUNC or module:FUNC (default: the plan's, else the tiny LM)")
    ap.add_argument("--seed", type=int, default=None, help="default: the plan's spec.seed, else 1234")
    ap.add_argument("--dtype", default=None, help="float64 | float32 | bfloat16 (default: the plan's, else float64)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plan", default=None, help="take vocab, max_len (and defaults) from this plan.json")
    ap.add_argument("--vocab", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=24)
    ap.add_argument("--scheme", choices=["gradcert", "module"], default="gradcert")
    a = ap.parse_args(argv)
    model_spec, seed, dtype, dirs = None, a.seed, a.dtype, ()
    if a.plan:
        try:
            plan = client.Plan.load(a.plan)
        except client.ProtocolError as e:
            print(f"gradcert initial: {e}", file=sys.stderr)
            return 2
        model_spec, dirs = plan.model_spec, (os.path.dirname(a.plan),)
        a.vocab, a.max_len = int(model_spec["vocab"]), int(model_spec["max_len"])
        seed = plan.spec.get("seed") if seed is None else seed
        dtype = dtype or plan.dtype_name
        a.factory = a.factory or plan.factory
    try:
        t = write_initial(a.factory, 1234 if seed is None else seed, dtype or "float64", a.out, a.vocab, a.max_len,
                          model_spec, a.scheme, dirs)
    except (factory_mod.FactoryError, ValueError) as e:
        print(f"gradcert initial: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": a.out, "tensors": len(t), "parameters": sum(x.numel() for x in t.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
