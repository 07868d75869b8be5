#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (conformance/fuzz/corpus/<target>/): small
valid inputs and one of each malformation the readers must refuse. Re-run after a format
change:  python3 conformance/fuzz/make_corpus.py [PLAN_JSON]
(PLAN_JSON: `gradcert plan --json` output; default: the committed corpus/plan/valid.json).
"""
import json
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
NONCE = "0123456789abcdef0123456789abcdef"


def put(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def st(header, data=b""):
    h = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(h)) + h + data


def deep(n, leaf="1"):
    return "[" * n + leaf + "]" * n


# safetensors
two = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2,1],"data_offsets":[8,16]}}'
put("safetensors", "valid", st(two + "    ", bytes(16)))
put("safetensors", "metadata", st('{"__metadata__":{"k":"v"},"a":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}', bytes(8)))
put("safetensors", "empty-header", st("{}"))
put("safetensors", "duplicate-name", st(two.replace('"b"', '"a"'), bytes(16)))
put("safetensors", "gap", st(two.replace("[8,16]", "[12,20]"), bytes(20)))
put("safetensors", "trailing", st(two, bytes(24)))
put("safetensors", "overlap", st(two.replace("[8,16]", "[4,12]"), bytes(16)))
put("safetensors", "nul-in-header", st(two + "\0junk", bytes(16)))
put("safetensors", "deep-header", st('{"a":' + deep(5000) + "}"))
put("safetensors", "truncated", st(two, bytes(12)))
put("safetensors", "huge-length", struct.pack("<Q", 1 << 62) + b"{}")
put("safetensors", "bf16-zero-size", st('{"a":{"dtype":"BF16","shape":[0,3],"data_offsets":[0,0]}}'))

# spec
put("spec", "empty", "{}")
put("spec", "typical", json.dumps({"seed": 7, "model": {"layers": 3}, "batch": {"micro": 1, "accum": 2},
                                   "topology": {"dp": 2, "tp": 1, "pp": 1}, "dtype": "float32",
                                   "optimizer": {"name": "adamw", "lr": 0.001},
                                   "timeout": {"collective_s": 10, "run_s": 60}}))
put("spec", "duplicate-key", '{"batch": {"micro": 2, "micro": 3}}')
put("spec", "deep", '{"batch": {"micro": ' + deep(10000) + "}}")
put("spec", "number-overflow", '{"timeout": {"run_s": 1e999}}')
put("spec", "timeout-range", '{"timeout": {"run_s": 1e10, "collective_s": 1e300}}')
put("spec", "wrong-types", '{"batch": {"micro": 2.0, "accum": true}, "dtype": 5}')
put("spec", "long-string", '{"dtype": "' + "x" * 5000 + '"}')
put("spec", "not-json", '{"batch": ')

# plan
plan_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus", "plan", "valid.json")
plan_text = open(plan_path).read()
plan = json.loads(plan_text)
put("plan", "valid.json", plan_text)
put("plan", "duplicate-key.json", plan_text.replace('"update_batch"', '"update_batch": 1, "update_batch"', 1))
put("plan", "float-update.json", json.dumps({**plan, "windows": [{**plan["windows"][0], "update": 0.0}] + plan["windows"][1:]}))
put("plan", "deep.json", plan_text.replace('"windows_per_epoch"', '"x": ' + deep(10000) + ', "windows_per_epoch"', 1))
put("plan", "truncated.json", plan_text[: len(plan_text) // 2])

# records: one manifest and one rank record for the default plan (world 2)
def manifest(**over):
    ups = [{"update": w["update"], "loss": 1.5, "valid_targets": w["valid_targets"], "step_seconds": 0.01,
            "grads": f"u{w['update']}.grads.safetensors", "params": f"u{w['update']}.params.safetensors"}
           for w in plan["windows"]]
    m = {"schema": "gradcert.artifacts/1", "backend": "fuzz", "world": 2, "nonce": NONCE, "updates": ups}
    m.update(over)
    return m


def rank(g, **over):
    ups = [{"update": w["update"], "consumed": [mb["ids"] for mb in w["slots"][g]], "loss_sum": 0.0,
            "valid_targets": 0} for w in plan["windows"]]
    r = {"schema": "gradcert.rank/1", "rank": g, "dp_rank": g, "nonce": NONCE, "updates": ups}
    r.update(over)
    return r


put("records", "manifest.json", json.dumps(manifest()))
put("records", "rank0.json", json.dumps(rank(0)))
put("records", "rank1.json", json.dumps(rank(1)))
m = manifest()
m["updates"][0]["update"] = 0.0
put("records", "manifest-float-update.json", json.dumps(m))
put("records", "rank-bool-dp.json", json.dumps(rank(1, dp_rank=True)))
r = rank(0)
r["updates"][0]["consumed"][0] = [float(x) for x in r["updates"][0]["consumed"][0]]
put("records", "rank-float-ids.json", json.dumps(r))
put("records", "manifest-no-nonce.json", json.dumps({k: v for k, v in manifest().items() if k != "nonce"}))
put("records", "manifest-dup-key.json", json.dumps(manifest()).replace('"loss": 1.5', '"loss": 1.5, "loss": 2', 1))
put("records", "manifest-deep-loss.json", json.dumps(manifest()).replace('"loss": 1.5', '"loss": ' + deep(10000), 1))
# schema 2 (NOTE [shard artifacts]): shard file lists, one of them naming a file twice
m2 = manifest(schema="gradcert.artifacts/2")
for u in m2["updates"]:
    for kind in ("grads", "params"):
        u[kind] = [f"u{u['update']}.rank{g}.{kind}.safetensors" for g in range(2)]
put("records", "manifest-shards.json", json.dumps(m2))
m2["updates"][1]["grads"][1] = m2["updates"][1]["grads"][0]
put("records", "manifest-shards-twice.json", json.dumps(m2))
put("records", "rank-deep-notes.json", json.dumps(rank(0)).replace('"updates"', '"notes": ' + deep(10000) + ', "updates"', 1))

# checkpoint.json (NOTE [checkpoint format])
cp = {"schema": "gradcert.checkpoint/1", "backend": "fsdp", "world": 2, "updates_done": 2, "optimizer_step": 2,
      "sampler": {"epoch": 0, "index_in_epoch": 2}, "nonce": NONCE}
put("checkpoint", "valid.json", json.dumps(cp))
put("checkpoint", "other-nonce.json", json.dumps(dict(cp, nonce="f" * 32)))
put("checkpoint", "float-step.json", json.dumps(dict(cp, optimizer_step=2.0)))
put("checkpoint", "huge-step.json", json.dumps(cp).replace('"optimizer_step": 2', '"optimizer_step": 18446744073709551615'))
put("checkpoint", "no-sampler.json", json.dumps({k: v for k, v in cp.items() if k != "sampler"}))
put("checkpoint", "dup-key.json", json.dumps(cp).replace('"world": 2', '"world": 2, "world": 3', 1))
put("checkpoint", "deep.json", json.dumps(cp).replace('"backend": "fsdp"', '"backend": ' + deep(10000), 1))
put("checkpoint", "not-json.json", '{"schema": ')
