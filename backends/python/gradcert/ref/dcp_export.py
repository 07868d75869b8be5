"""A stack's DCP checkpoint in gradcert's layout-independent form (NOTE [stack checkpoints]).

    python -m gradcert.ref.dcp_export --from CHECKPOINT.STACK --out CHECKPOINT --world W --nonce N

Run by the harness after the first leg of an external resumed run, when every process of
the stack has exited: it reads what is on disk, with torch.distributed.checkpoint's own
metadata (.metadata: every tensor's chunks and the file, offset and length of each), not
with the stack's load code. Every chunk becomes a placed piece (NOTE [checkpoint format],
conformance/protocol/checkpoint.cpp) of the rank whose file holds it (__<r>_<k>.distcp),
replica group 0, in the dtype it was saved in:

    model.<p>                     -> param.<p>
    optim.state.<p>.exp_avg       -> optim.<p>.m     (AdamW)
    optim.state.<p>.exp_avg_sq    -> optim.<p>.v
    optim.state.<p>.momentum_buffer -> optim.<p>.m   (SGD with momentum)
    optim.state.<p>.step          -> the optimizer step counter of checkpoint.json

A rank whose files are not on disk gets no rank<r>.safetensors, so gradcert's reader names
that rank and the elements no file holds; other keys (param_groups) are not tensors of the
state and are left out. checkpoint.json takes updates_done and the sampler position from
the stack's gradcert.json and the step counter from the saved "step" tensors (all equal, or
this fails naming two that differ). Exit 2 with a message for anything it cannot read.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys

import torch
from safetensors.torch import save_file

from .checkpoint import FORMAT, read_manifest
from .client import ProtocolError, _atomic_write, write_json

_FILE = re.compile(r"^__(\d+)_(\d+)\.distcp$")
_SLOTS = {"exp_avg": "m", "exp_avg_sq": "v", "momentum_buffer": "m"}


def canonical(fqn: str):
    """('param', p) / ('slot', p, s) / ('step', p) / None for a DCP key."""
    if fqn.startswith("model."):
        return ("param", fqn[len("model."):])
    if fqn.startswith("optim.state."):
        rest = fqn[len("optim.state."):]
        for suffix, slot in _SLOTS.items():
            if rest.endswith("." + suffix):
                return ("slot", rest[: -len(suffix) - 1], slot)
        if rest.endswith(".step"):
            return ("step", rest[: -len(".step")])
    return None


def export(src: str, out: str, world: int, nonce: str | None) -> dict:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    manifest = read_manifest(src, nonce)
    if manifest.get("format") != FORMAT:
        raise ProtocolError(f"{src}/gradcert.json: field 'format' is {manifest.get('format')!r}; gradcert reads "
                            f"{FORMAT!r} checkpoints")
    try:
        md = FileSystemReader(src).read_metadata()
    except Exception as e:  # noqa: BLE001 (torch raises several kinds)
        raise ProtocolError(f"{src}: no readable DCP metadata (.metadata): {e}")
    stored = {r: ({}, {}) for r in range(world)}
    present = {r: bool([f for f in os.listdir(src) if (m := _FILE.match(f)) and int(m.group(1)) == r])
               for r in range(world)}
    steps, missing = {}, {}
    for idx, info in sorted(md.storage_data.items(), key=lambda kv: (kv[0].fqn, tuple(kv[0].offset or ()))):
        tmd = md.state_dict_metadata.get(idx.fqn)
        if not isinstance(tmd, TensorStorageMetadata):
            continue
        what = canonical(idx.fqn)
        if what is None:
            continue
        m = _FILE.match(info.relative_path)
        if not m:
            raise ProtocolError(f"{src}: tensor {idx.fqn!r} lies in {info.relative_path!r}, not a __<rank>_<k>.distcp")
        rank = int(m.group(1))
        if rank >= world:
            raise ProtocolError(f"{src}/{info.relative_path}: rank {rank} wrote it, but the first leg ran {world}")
        path = os.path.join(src, info.relative_path)
        if not os.path.exists(path):
            missing.setdefault(rank, set()).add(idx.fqn)
            continue
        if getattr(info, "transform_descriptors", None):
            raise ProtocolError(f"{path}: {idx.fqn!r} is stored transformed ({info.transform_descriptors}); "
                                "gradcert reads plain torch.save chunks")
        with open(path, "rb") as f:
            f.seek(info.offset)
            raw = f.read(info.length)
        if len(raw) != info.length:
            raise ProtocolError(f"{path}: {idx.fqn!r} should hold {info.length} bytes at {info.offset}; the file "
                                f"ends after {len(raw)}")
        try:
            t = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise ProtocolError(f"{path}: {idx.fqn!r} at byte {info.offset}: not a torch.save'd tensor ({e})")
        chunk = next((c for c in tmd.chunks if tuple(c.offsets) == tuple(idx.offset or ())), None)
        if chunk is None or tuple(t.shape) != tuple(chunk.sizes):
            raise ProtocolError(f"{path}: {idx.fqn!r} at offset {list(idx.offset or ())} holds shape "
                                f"{list(t.shape)}; the metadata says {list(chunk.sizes) if chunk else 'no chunk'}")
        if what[0] == "step":
            steps[what[1]] = float(t.reshape(-1)[0]) if t.numel() == 1 else None
            continue
        name = "param." + what[1] if what[0] == "param" else f"optim.{what[1]}.{what[2]}"
        if t.numel() == 0:
            continue
        tensors, placement = stored[rank]
        key = name if name not in tensors else f"{name}@{','.join(map(str, idx.offset))}"
        tensors[key] = t.contiguous().clone()
        placement[key] = {"tensor": name, "shape": list(tmd.size), "replica": 0, "offset": list(idx.offset or ())}
    os.makedirs(out, exist_ok=True)
    for r in range(world):
        if not present[r]:
            print(f"dcp_export: rank {r} has no __{r}_*.distcp file in {src} (tensors it held: "
                  f"{', '.join(sorted(missing.get(r, ()))) or 'none the metadata names'}): no rank{r}.safetensors",
                  file=sys.stderr)
            continue
        tensors, placement = stored[r]
        md_out = {"gradcert.placement": json.dumps(placement), "gradcert.source": f"DCP {src}"}
        _atomic_write(os.path.join(out, f"rank{r}.safetensors"), lambda tmp: save_file(tensors, tmp, metadata=md_out))
    step = int(manifest["optimizer_step"])
    if steps:
        values = set(steps.values())
        if len(values) != 1 or None in values or not float(next(iter(values))).is_integer():
            order = sorted(steps, key=lambda p: (steps[p] is None, steps[p] or 0.0))  # None (not a scalar) last
            a, b = order[0], order[-1]
            raise ProtocolError(f"{src}: the saved step counters differ: {a!r} has {steps[a]}, {b!r} has {steps[b]}")
        step = int(next(iter(values)))
    record = {"schema": "gradcert.checkpoint/1", "backend": manifest.get("backend", "?"), "world": int(manifest["world"]),
              "updates_done": int(manifest["updates_done"]), "optimizer_step": step,
              "sampler": manifest["sampler"], "nonce": manifest.get("nonce")}
    if isinstance(manifest.get("save_seconds"), (int, float)) and not isinstance(manifest["save_seconds"], bool):
        record["save_seconds"] = float(manifest["save_seconds"])  # the stack's own pause (throughput "save ms")
    write_json(os.path.join(out, "checkpoint.json"), record)
    return record


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="src", required=True, help="the stack's checkpoint folder (GRADCERT_SAVE_DIR)")
    ap.add_argument("--out", required=True, help="where gradcert's form goes (the run folder's checkpoint/)")
    ap.add_argument("--world", type=int, required=True, help="the first leg's ranks")
    ap.add_argument("--nonce", default=None, help="the run's nonce (GRADCERT_RUN_NONCE)")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.src):
        print(f"dcp_export: {a.src}: no such folder (the stack saved no checkpoint in GRADCERT_SAVE_DIR)",
              file=sys.stderr)
        return 2
    try:
        rec = export(a.src, a.out, a.world, a.nonce)
    except ProtocolError as e:
        print(f"dcp_export: {e}", file=sys.stderr)
        return 2
    print(f"dcp_export: {a.src} -> {a.out}: updates_done {rec['updates_done']}, step {rec['optimizer_step']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
