"""A fake external "stack" for gradcert's tests (test_external.cpp): no torch, no ranks.

    python3 fake_external_stack.py MODE

Writes a complete, well-formed artifact set for the plan (rank<g>.json, manifest.json,
u<k>.grads/params.safetensors with zero tensors of the right names, shapes and dtype),
then damages u0.grads.safetensors according to MODE, so gradcert's strict reader must
fail the run naming the file (and the tensor):

  ok              nothing damaged (the artifacts read; the checks then fail on values)
  truncated       the file loses its last 8 bytes (the last tensor, wte.weight, is cut)
  wrong-shape     blocks.0.fc.weight has its dimensions swapped
  wrong-dtype     blocks.0.fc.weight is written as F32 (F16 for a float32 run)
  missing-tensor  blocks.0.fc.weight is left out
  oversized-header  the header length field says 200 MiB
  silent          writes nothing and exits 0 (a reused run folder must not pass on old files)
  no-nonce        manifest.json leaves out "nonce" (GRADCERT_RUN_NONCE)
  other-nonce     rank1.json carries another run's nonce
  float-ids       rank0.json reports its first sample id as a float (3.0)
  deep-notes      manifest.json's "notes" (read by the audit) is nested 100000 levels deep
  fifo-grads      u0.grads.safetensors is a FIFO no one writes
  zero-link       u0.grads.safetensors is a symbolic link to /dev/zero
  outside-link    u0.grads.safetensors is a symbolic link to secret.txt beside the run folder
  outside-hardlink  u0.grads.safetensors is a hard link to secret.txt beside the run folder

Every file echoes GRADCERT_RUN_NONCE as "nonce" (backends/PROTOCOL.md) unless MODE says not.
"""

import json
import os
import struct
import sys

BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2}
SPEC_DTYPE = {"float64": "F64", "float32": "F32", "bfloat16": "BF16"}
VICTIM = "blocks.0.fc.weight"


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def safetensors_bytes(tensors):
    """tensors: [(name, dtype, shape)] in file order, zero-filled."""
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        numel = 1
        for d in shape:
            numel *= d
        size = numel * BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(offset)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if mode == "silent":
        return
    out = os.environ["GRADCERT_OUT"]
    nonce = os.environ["GRADCERT_RUN_NONCE"]
    with open(os.environ["GRADCERT_PLAN"]) as f:
        plan = json.load(f)
    dtype = SPEC_DTYPE[plan["spec"]["dtype"]]
    shapes = {n: e["shape"] for n, e in read_header(os.environ["GRADCERT_INIT"]).items() if n != "__metadata__"}
    dp = plan["topology"]["dp"]
    ranks = dp * plan["topology"]["tp"] * plan["topology"]["pp"]

    for g in range(ranks):
        d = g // (plan["topology"]["tp"] * plan["topology"]["pp"])
        ups = [{"update": w["update"], "consumed": [mb["ids"] for mb in w["slots"][d]],
                "loss_sum": 0.0, "valid_targets": sum(mb["valid_targets"] for mb in w["slots"][d])}
               for w in plan["windows"]]
        if mode == "float-ids" and g == 0:
            first = next(mbs for up in ups for mbs in up["consumed"] if mbs)
            first[0] = float(first[0])
        rec = {"schema": "gradcert.rank/1", "rank": g, "dp_rank": d, "nonce": nonce, "updates": ups}
        if mode == "other-nonce" and g == 1:
            rec["nonce"] = "0" * 32
        with open(os.path.join(out, f"rank{g}.json"), "w") as f:
            json.dump(rec, f)

    updates = []
    for w in plan["windows"]:
        u = w["update"]
        for kind in ("grads", "params"):
            tensors = [(n, dtype, shapes[n]) for n in sorted(shapes)]
            damaged = u == 0 and kind == "grads"
            if damaged and mode == "wrong-shape":
                tensors = [(n, t, list(reversed(s)) if n == VICTIM else s) for n, t, s in tensors]
            if damaged and mode == "wrong-dtype":
                other = "F16" if dtype == "F32" else "F32"
                tensors = [(n, other if n == VICTIM else t, s) for n, t, s in tensors]
            if damaged and mode == "missing-tensor":
                tensors = [x for x in tensors if x[0] != VICTIM]
            data = safetensors_bytes(tensors)
            if damaged and mode == "truncated":
                data = data[:-8]
            if damaged and mode == "oversized-header":
                data = struct.pack("<Q", 200 << 20) + data[8:]
            with open(os.path.join(out, f"u{u}.{kind}.safetensors"), "wb") as f:
                f.write(data)
        updates.append({"update": u, "loss": 0.0, "valid_targets": w["valid_targets"], "step_seconds": 0.0,
                        "grads": f"u{u}.grads.safetensors", "params": f"u{u}.params.safetensors"})
    manifest = {"schema": "gradcert.artifacts/1", "backend": f"fake-{mode}", "world": ranks, "nonce": nonce,
                "updates": updates}
    if mode == "no-nonce":
        del manifest["nonce"]
    text = json.dumps(manifest)
    if mode == "deep-notes":  # json.dumps would recurse; splice the text in
        text = text[:-1] + ', "notes": ' + "[" * 100000 + "]" * 100000 + "}"
    with open(os.path.join(out, "manifest.json"), "w") as f:
        f.write(text)
    victim = os.path.join(out, "u0.grads.safetensors")
    if mode == "fifo-grads":
        os.remove(victim)
        os.mkfifo(victim)
    if mode in ("zero-link", "outside-link"):
        os.remove(victim)
        target = "/dev/zero"
        if mode == "outside-link":
            target = os.path.join(os.path.dirname(os.path.abspath(out)), "secret.txt")
            with open(target, "wb") as f:
                f.write(b"PASSWORD" * 16)  # read as a header length, these 8 bytes were echoed
        os.symlink(target, victim)
    if mode == "outside-hardlink":
        os.remove(victim)
        target = os.path.join(os.path.dirname(os.path.abspath(out)), "secret.txt")
        with open(target, "wb") as f:
            f.write(b"PASSWORD" * 16)
        os.link(target, victim)


if __name__ == "__main__":
    main()
