"""Helpers shared by backends/python's tests (test_gradcert_client.py, test_gradcert_ref.py):
paths, the scratch folder, the inputs gradcert (or a Python stand-in) writes, running an
adapter under torchrun as gradcert would, and comparing artifacts.

Inputs (plan.json, dataset.json, initial.safetensors) come from gradcert itself
(`build/gradcert run --backend external --command true` writes them, then fails on the
missing artifacts) when build/gradcert exists (or $GRADCERT_EXE), else from a Python
stand-in plan (python_inputs) with the same shape: 26 examples, B_micro 2, A 3, a partial
final window. GRADCERT_TEST_PY_PLAN=1 forces the stand-in. GRADCERT_TEST_KEEP=1 keeps the
scratch folder.
"""

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

import torch

TESTS = os.path.dirname(os.path.abspath(__file__))
PY = os.path.dirname(TESTS)
REPO = os.path.dirname(os.path.dirname(PY))
if PY not in sys.path:  # the test bed (testbed/) is not installed: pytest.ini's pythonpath, else here (unittest)
    sys.path.insert(0, PY)

from gradcert.tiny_lm import TINY_LM_DEFAULTS  # noqa: E402
from gradcert.ref import client, initial  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

TORCHRUN = os.path.join(REPO, ".venv", "bin", "torchrun")
EXE = os.environ.get("GRADCERT_EXE", os.path.join(REPO, "build", "gradcert"))
HAVE_EXE = os.access(EXE, os.X_OK) and os.environ.get("GRADCERT_TEST_PY_PLAN") != "1"
GRU = os.path.join(TESTS, "factories.py") + ":gru_lm"
torch.set_num_threads(1)
_TMP = None


def make_tmp():
    """A test module's setUpModule: a fresh scratch folder for its tests."""
    global _TMP
    _TMP = tempfile.mkdtemp(prefix="gradcert_pytest_")


def remove_tmp():
    """A test module's tearDownModule: the scratch folder goes (unless GRADCERT_TEST_KEEP=1)."""
    global _TMP
    if _TMP and os.environ.get("GRADCERT_TEST_KEEP") != "1":
        shutil.rmtree(_TMP, ignore_errors=True)
    _TMP = None


def scratch() -> str:
    """The scratch folder of the running test module."""
    assert _TMP, "helpers.make_tmp() has not run (the test module's setUpModule)"
    return _TMP


# --------------------------------------------------------------------------------------
# Inputs, adapters, comparisons
# --------------------------------------------------------------------------------------


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    nb = float(b.norm())
    return float((a - b).norm()) / nb if nb > 0 else float(a.norm())


def worst(dir_a, dir_b, kind, update):
    ta = load_file(os.path.join(dir_a, f"u{update}.{kind}.safetensors"))
    tb = load_file(os.path.join(dir_b, f"u{update}.{kind}.safetensors"))
    assert set(ta) == set(tb), (sorted(ta), sorted(tb))
    return max(rel_l2(ta[n], tb[n]) for n in tb)


def python_inputs(dest, world, size=26, micro=2, accum=3, seed=1234, model_factory=None):
    """A stand-in for gradcert's inputs (same protocol, simpler sampling): sequential
    windows of B_micro x A x D ids; example k of a window goes to DP rank (k / micro) % D,
    microstep k / (micro D). Tiny LM sizes (or `model_factory`, named in the plan), SGD lr 0.1."""
    os.makedirs(dest, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(size):
        n = int(torch.randint(3, 25, (1,), generator=g))
        toks = [int(t) for t in torch.randint(1, 32, (n,), generator=g)]
        prompt = int(torch.randint(0, n // 2 + 1, (1,), generator=g))
        labels = [toks[t + 1] if t + 1 < n and t + 1 >= prompt else -100 for t in range(n)]
        samples.append({"id": i, "tokens": toks, "labels": labels})
    ds = {"schema": "gradcert.dataset/1", "ignore_index": -100, "pad_token": 0, "samples": samples}
    count = lambda ids: sum(sum(1 for l in samples[i]["labels"] if l != -100) for i in ids)  # noqa: E731
    ub = micro * accum * world
    windows = []
    for u, start in enumerate(range(0, size, ub)):
        ids = list(range(start, min(size, start + ub)))
        slots = [[{"ids": [], "valid_targets": 0} for _ in range(accum)] for _ in range(world)]
        for k, i in enumerate(ids):
            s = slots[(k // micro) % world][k // (micro * world)]
            s["ids"].append(i)
            s["valid_targets"] = count(s["ids"])
        windows.append({"update": u, "epoch": 0, "partial": len(ids) < ub, "ids": ids,
                        "valid_targets": count(ids), "slots": slots})
    spec = {"batch": {"micro": micro, "accum": accum}, "dtype": "float64", "seed": seed,
            "model": dict(TINY_LM_DEFAULTS, **({"factory": model_factory} if model_factory else {})),
            "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "beta1": 0.9,
                          "beta2": 0.999, "eps": 1e-8},
            "timeout": {"collective_s": 60.0, "run_s": 300.0}, "topology": {"dp": world, "tp": 1, "pp": 1}}
    plan = {"schema": "gradcert.plan/1", "spec": spec, "topology": {"dp": world, "tp": 1, "pp": 1},
            "update_batch": ub, "windows_per_epoch": len(windows), "windows": windows}
    client.write_json(os.path.join(dest, "plan.json"), plan)
    client.write_json(os.path.join(dest, "dataset.json"), ds)
    initial.write_initial(model_factory, seed, "float64", os.path.join(dest, "initial.safetensors"))
    return dest


def gradcert_inputs(dest, world):
    """gradcert's own inputs for the default spec at `world` (cached per world)."""
    tmp = os.path.join(scratch(), f"gc_inputs_w{world}")
    if not os.path.isdir(tmp):
        subprocess.run([EXE, "run", "--backend", "external", "--world", str(world), "--command", "true",
                        "--out", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    src = glob.glob(os.path.join(tmp, "runs", "*"))
    assert src, f"{EXE} wrote no run folder under {tmp}"
    os.makedirs(dest, exist_ok=True)
    for f in ("plan.json", "dataset.json", "initial.safetensors"):
        shutil.copy(os.path.join(src[0], f), dest)
    return dest


def inputs(name, world):
    dest = os.path.join(scratch(), name)
    return gradcert_inputs(dest, world) if HAVE_EXE else python_inputs(dest, world)


def edit_plan(run_dir, fn):
    path = os.path.join(run_dir, "plan.json")
    with open(path) as f:
        plan = json.load(f)
    fn(plan)
    client.write_json(path, plan)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_adapter(script, run_dir, out, world, args=(), sampler="plan"):
    """Runs an adapter under torchrun as gradcert would (GRADCERT_* environment)."""
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, GRADCERT_RUN_DIR=run_dir, GRADCERT_PLAN=os.path.join(run_dir, "plan.json"),
               GRADCERT_DATASET=os.path.join(run_dir, "dataset.json"),
               GRADCERT_INIT=os.path.join(run_dir, "initial.safetensors"), GRADCERT_OUT=out,
               GRADCERT_NPROC=str(world), GRADCERT_SAMPLER=sampler, OMP_NUM_THREADS="1")
    cmd = [TORCHRUN, f"--nproc_per_node={world}", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           os.path.join(PY, script), *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-8000:]}")
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def needs_torchrun(t):
    return unittest.skipUnless(os.access(TORCHRUN, os.X_OK), f"{TORCHRUN} missing (scripts/bootstrap)")(t)
