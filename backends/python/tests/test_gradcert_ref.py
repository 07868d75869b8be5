"""Tests of backends/python: the client library, factories, the float64 reference runner,
the initial-weights writer, the adapters (a GRU LM through torch-ddp at world 2) and the
adapters' mutants.

    .venv/bin/python -m pytest backends/python/tests -q        # or
    .venv/bin/python -m unittest discover -s backends/python/tests -v

Inputs (plan.json, dataset.json, initial.safetensors) come from gradcert itself
(`build/gradcert run --backend external --command true` writes them, then fails on the
missing artifacts) when build/gradcert exists (or $GRADCERT_EXE), else from a Python
stand-in plan (python_inputs) with the same shape: 26 examples, B_micro 2, A 3, a partial
final window. GRADCERT_TEST_PY_PLAN=1 forces the stand-in. Tests that compare with
gradcert's C++ artifacts skip without the binary. GRADCERT_TEST_CERTIFY=1 also runs
`gradcert run --backend external` on every mutant (slow: ~8 s each).
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

from gradcert import tiny_lm as gm  # noqa: E402
from gradcert.ref import client, factory, initial, mutants, reference  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

TORCHRUN = os.path.join(REPO, ".venv", "bin", "torchrun")
EXE = os.environ.get("GRADCERT_EXE", os.path.join(REPO, "build", "gradcert"))
HAVE_EXE = os.access(EXE, os.X_OK) and os.environ.get("GRADCERT_TEST_PY_PLAN") != "1"
GRU = os.path.join(TESTS, "factories.py") + ":gru_lm"
torch.set_num_threads(1)
_TMP = None


def setUpModule():
    global _TMP
    _TMP = tempfile.mkdtemp(prefix="gradcert_pytest_")


def tearDownModule():
    if _TMP and os.environ.get("GRADCERT_TEST_KEEP") != "1":
        shutil.rmtree(_TMP, ignore_errors=True)


# --------------------------------------------------------------------------------------
# Helpers
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
            "model": dict(gm.TINY_LM_DEFAULTS, **({"factory": model_factory} if model_factory else {})),
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
    tmp = os.path.join(_TMP, f"gc_inputs_w{world}")
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
    dest = os.path.join(_TMP, name)
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


# --------------------------------------------------------------------------------------
# Unit tests: client, factory, recorder, catalog
# --------------------------------------------------------------------------------------


class ClientTest(unittest.TestCase):
    def test_collate_right_pads_with_pad_token_and_ignore_index(self):
        ds = client.Dataset({"schema": "gradcert.dataset/1", "ignore_index": -100, "pad_token": 0, "samples": [
            {"id": 3, "tokens": [5, 6, 7], "labels": [-100, 7, -100]},
            {"id": 9, "tokens": [1, 2, 3, 4, 5], "labels": [2, 3, 4, 5, -100]}]})
        b = ds.collate([3, 9])
        self.assertEqual(b.input.tolist(), [[5, 6, 7, 0, 0], [1, 2, 3, 4, 5]])
        self.assertEqual(b.labels.tolist(), [[-100, 7, -100, -100, -100], [2, 3, 4, 5, -100]])
        self.assertEqual(b.valid_targets, 5)
        self.assertIsNone(ds.collate([]))
        self.assertEqual(ds.rows_with_targets([3, 9]), 2)
        with self.assertRaisesRegex(client.ProtocolError, "no sample with id 4"):
            ds.collate([4])

    def test_grad_recorder_captures_the_gradient_before_the_step(self):
        for kind in ("torch", "hand"):
            torch.manual_seed(0)
            model = torch.nn.Linear(3, 2).double()
            opt = gm.make_optimizer(model.parameters(), {"name": "sgd", "lr": 0.5, "momentum": 0.0,
                                                         "weight_decay": 0.0}, kind)
            rec = client.GradRecorder(opt, named_parameters=model.named_parameters())
            for _ in range(2):  # two microsteps accumulate
                model(torch.randn(4, 3, dtype=torch.float64)).pow(2).sum().backward()
            expected = {n: p.grad.clone() for n, p in model.named_parameters()}
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.step()
            got = rec.pop()
            for n, p in model.named_parameters():
                self.assertTrue(torch.equal(got[n], expected[n]), (kind, n))
                self.assertTrue(torch.allclose(p, before[n] - 0.5 * expected[n]), (kind, n))
            with self.assertRaises(RuntimeError):
                rec.pop()
            rec.remove()

    def test_shard_files_are_assembled_from_the_lowest_replica_group(self):
        # (NOTE [shard artifacts]) rank 0 writes rows 0..1 of w as a box and b[0:3] as a flat
        # range; rank 1 the rest, and a second replica group (its own whole copy) that is ignored.
        from safetensors.torch import save_file

        d = tempfile.mkdtemp(prefix="shards_", dir=_TMP)
        w, b = torch.arange(12, dtype=torch.float64).reshape(3, 4), torch.arange(5, dtype=torch.float64) + 100
        files = {
            "r0.safetensors": ({"w": w[0:2].clone(), "b": b[0:3].clone()},
                               {"w": {"tensor": "w", "shape": [3, 4], "replica": 0, "offset": [0, 0]},
                                "b": {"tensor": "b", "shape": [5], "replica": 0, "flat": [0, 3]}}),
            "r1.safetensors": ({"w": w[2:3].clone(), "b": b[3:5].clone(), "w#1": -w},
                               {"w": {"tensor": "w", "shape": [3, 4], "replica": 0, "offset": [2, 0]},
                                "b": {"tensor": "b", "shape": [5], "replica": 0, "flat": [3, 5]},
                                "w#1": {"tensor": "w", "shape": [3, 4], "replica": 1, "offset": [0, 0]}}),
        }
        for name, (tensors, placement) in files.items():
            save_file(tensors, os.path.join(d, name), metadata={"gradcert.placement": json.dumps(placement)})
        got = client.load_stack_tensors(d, sorted(files))
        self.assertTrue(torch.equal(got["w"], w))
        self.assertTrue(torch.equal(got["b"], b))
        save_file({"w": w}, os.path.join(d, "bad.safetensors"), metadata={"gradcert.placement": "{}"})
        with self.assertRaisesRegex(client.ProtocolError, "tensor 'w' has no entry"):
            client.load_stack_tensors(d, ["bad.safetensors"])

    def test_wrong_is_a_hidden_alias_of_mutant(self):
        import argparse

        ap = argparse.ArgumentParser()
        gm.add_common_args(ap)
        self.assertEqual(ap.parse_args(["--wrong", "local-mean"]).mutant, "local-mean")
        self.assertEqual(ap.parse_args(["--mutant", "grad-scale-1.05"]).mutant, "grad-scale-1.05")
        self.assertIsNone(ap.parse_args([]).mutant)
        self.assertNotIn("--wrong", ap.format_help())
        self.assertEqual(gm.backend_name("torch-ddp", "micro-mean"), "torch-ddp+mutant=micro-mean")


class FactoryTest(unittest.TestCase):
    F = os.path.join(TESTS, "factories.py")

    def test_builtin_and_file_factories(self):
        m = factory.build(None, 32, 24, spec={"d_model": 8, "heads": 2, "layers": 1, "d_ff": 16})
        self.assertIsInstance(m, gm.TinyLM)  # the very class the adapters wrap
        self.assertEqual(m.wte.weight.shape, (32, 8))
        self.assertEqual(len(factory.units(m)), 1)
        g = factory.build(f"{self.F}:gru_lm", 40, 24)
        self.assertEqual(g.head.weight.shape, (40, 12))
        self.assertEqual(factory.units(g), [])  # no ModuleList: the root alone
        s = factory.build(f"{self.F}:with_spec", 40, 24, spec={"d_model": 6})
        self.assertEqual(s.seen_spec, {"d_model": 6})
        self.assertIsInstance(factory.build("gradcert.tiny_lm:tiny_lm", 32, 24), gm.TinyLM)

    def test_errors_name_the_factory(self):
        cases = [("nope.py:f", "file 'nope.py' not found"), (f"{self.F}:missing", "has no 'missing'"),
                 (f"{self.F}:not_a_module", "returned str, not a torch.nn.Module"),
                 (f"{self.F}:raises", "raised RuntimeError: boom"), ("no_colon", "expected FILE.py:FUNC"),
                 ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'")]
        for name, msg in cases:
            with self.assertRaises(factory.FactoryError) as e:
                factory.build(name, 32, 24)
            self.assertIn(f"'{name}", str(e.exception))
            self.assertIn(msg, str(e.exception))


class CatalogTest(unittest.TestCase):
    def test_command_sh_resolves_names_and_aliases(self):
        sh = os.path.join(PY, "command.sh")
        for name, script in [("torch-ddp", "torch_ddp.py"), ("fsdp1", "torch_fsdp1.py"),
                             ("torch-fsdp1", "torch_fsdp1.py"), ("fsdp2", "torch_fsdp2.py"),
                             ("torch-fsdp2", "torch_fsdp2.py")]:
            out = subprocess.run(["sh", sh, name, "--wrong", "local-mean"], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout, f"{REPO}/.venv/bin/torchrun --nproc_per_node=$GRADCERT_NPROC "
                             f"--master_addr=127.0.0.1 --master_port=$GRADCERT_MASTER_PORT "
                             f"{REPO}/backends/python/{script} --wrong local-mean\n")
        bad = subprocess.run(["sh", sh, "megatron"], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("unknown adapter 'megatron' (known: torch-ddp, torch-fsdp1 (fsdp1), torch-fsdp2 (fsdp2))",
                      bad.stderr)

    def test_catalog_texts_are_audit_cpp_verbatim_and_mutants_exist(self):
        with open(os.path.join(PY, "adapters.json")) as f:
            cat = json.load(f)
        self.assertEqual(cat["schema"], "gradcert.adapters/1")
        for a in cat["adapters"]:
            self.assertTrue(os.path.isfile(os.path.join(PY, a["script"])), a)
            # every listed id exists; clip-per-rank is torch-ddp's alone (a replica reduces by hand)
            self.assertTrue(set(a["mutants"]) <= set(mutants.MUTANTS), a["name"])
            self.assertEqual(set(mutants.MUTANTS) - set(a["mutants"]) - {"clip-per-rank"}, set(), a["name"])
        # adapters.json is the one source of these facts: the C++ audit reads it
        # (conformance/audit/sides.cpp), so no C++ file repeats an adapter's texts.
        srcs = glob.glob(os.path.join(REPO, "conformance", "**", "*.cpp"), recursive=True)
        self.assertTrue(srcs)
        for p in srcs:
            text = open(p).read()
            for a in cat["adapters"]:
                for key in ("reduction",):  # sync texts also appear in the FSDP1 -> FSDP2 notes
                    self.assertNotIn(a[key], text, (p, a["name"], key))


# --------------------------------------------------------------------------------------
# The reference runner
# --------------------------------------------------------------------------------------


class ReferenceTest(unittest.TestCase):
    @unittest.skipUnless(HAVE_EXE, f"{EXE} missing (the C++ build)")
    def test_initial_reproduces_gradcert_initial_bit_for_bit(self):
        d = inputs("init_w1", 1)
        initial.main(["--plan", os.path.join(d, "plan.json"), "--out", os.path.join(d, "py_initial.safetensors")])
        a, b = load_file(os.path.join(d, "py_initial.safetensors")), load_file(os.path.join(d, "initial.safetensors"))
        self.assertEqual(sorted(a), sorted(b))
        for n in b:
            self.assertTrue(torch.equal(a[n], b[n]), n)

    @unittest.skipUnless(HAVE_EXE, f"{EXE} missing (the C++ build)")
    def test_a_reference_matches_cpp_single_run_on_the_tiny_lm(self):
        d = inputs("ref_w1", 1)
        single = os.path.join(_TMP, "single_w1")
        subprocess.run([EXE, "run", "--backend", "single", "--world", "1", "--out", single],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=True)
        cpp = glob.glob(os.path.join(single, "runs", "*"))[0]
        m = reference.run_reference(d)
        ref = os.path.join(d, "reference")
        with open(os.path.join(cpp, "manifest.json")) as f:
            mc = json.load(f)
        self.assertEqual(len(m["updates"]), len(mc["updates"]))
        figures = []
        for u, (ours, theirs) in enumerate(zip(m["updates"], mc["updates"])):
            self.assertEqual(ours["valid_targets"], theirs["valid_targets"])
            self.assertAlmostEqual(ours["loss"], theirs["loss"], delta=1e-12 * abs(theirs["loss"]))
            for kind in ("grads", "params"):
                figures.append(worst(ref, cpp, kind, u))
                self.assertLessEqual(figures[-1], 1e-12, (u, kind))
        print(f"\n[ figure ] python reference vs C++ single, tiny LM, {len(m['updates'])} updates: "
              f"max rel L2 {max(figures):.3g}")
        self.assertTrue(m["precision"]["float64_throughout"])

    def test_pieces_at_the_stacks_parameters(self):
        """--pieces-at: the pieces of update u are at the stack's parameters after u-1. A stack
        that stood where the reference stood gives the reference's own pieces; one whose
        parameters differ gives other pieces (update 0: always the initial weights)."""
        d = python_inputs(os.path.join(_TMP, "py_plan_at"), 2, model_factory=GRU)
        own = os.path.join(d, "own")
        reference.run_reference(d, out=own)
        same = reference.run_reference(d, out=os.path.join(d, "same"), pieces_at=own)
        self.assertEqual(same["reference"]["pieces_at"], "stack")
        moved = os.path.join(d, "moved")
        os.makedirs(moved)
        with open(os.path.join(own, "manifest.json")) as f:
            m = json.load(f)
        for e in m["updates"]:
            p = load_file(os.path.join(own, e["params"]))
            client.write_tensors(os.path.join(moved, e["params"]), {k: v * 1.01 for k, v in p.items()}, torch.float64)
        client.write_json(os.path.join(moved, "manifest.json"), m)
        reference.run_reference(d, out=os.path.join(d, "at_moved"), pieces_at=moved)
        for u in range(len(m["updates"])):
            a = load_file(os.path.join(own, f"u{u}.pieces.safetensors"))
            b = load_file(os.path.join(d, "same", f"u{u}.pieces.safetensors"))
            c = load_file(os.path.join(d, "at_moved", f"u{u}.pieces.safetensors"))
            self.assertEqual(max(rel_l2(a[k], b[k]) for k in a), 0.0, u)
            moved_by = max(rel_l2(a[k], c[k]) for k in a if a[k].abs().sum() > 0)
            if u == 0:
                self.assertEqual(moved_by, 0.0)
            else:
                self.assertGreater(moved_by, 1e-4, u)

    def test_pieces_sum_to_the_gradient_on_the_python_plan(self):
        d = python_inputs(os.path.join(_TMP, "py_plan_w2"), 2, model_factory=GRU)
        m = reference.run_reference(d)
        ref = os.path.join(d, "reference")
        plan = client.Plan.load(os.path.join(d, "plan.json"))
        self.assertTrue(plan.partial(len(plan) - 1))
        for u in range(len(plan)):
            grads = load_file(os.path.join(ref, f"u{u}.grads.safetensors"))
            pieces = load_file(os.path.join(ref, f"u{u}.pieces.safetensors"))
            with open(os.path.join(ref, f"u{u}.pieces.json")) as f:
                meta = json.load(f)
            N = meta["valid_targets"]
            self.assertEqual(N, plan.window_targets(u))
            self.assertEqual(sum(p["valid_targets"] for p in meta["pieces"]), N)
            self.assertAlmostEqual(sum(p["loss_sum"] for p in meta["pieces"]) / N, m["updates"][u]["loss"], delta=1e-12)
            for n, g in grads.items():
                s = sum(pieces[f"r{p['dp_rank']}.a{p['micro']}.{n}"] for p in meta["pieces"]) / N
                self.assertLessEqual(rel_l2(s, g), 1e-12, (u, n))
        self.assertEqual(sorted(load_file(os.path.join(ref, "u0.params.safetensors"))),
                         sorted(n for n, _ in factory.build(GRU, 32, 24).named_parameters()))

    def test_precision_probe_finds_float32_inside_a_float64_model(self):
        d = python_inputs(os.path.join(_TMP, "py_plan_half"), 1, model_factory=os.path.join(TESTS, "factories.py") +
                          ":half_inside")
        m = reference.run_reference(d, pieces=False)
        p = m["precision"]
        self.assertFalse(p["float64_throughout"])
        self.assertTrue(any(o["dtype"] == "float32" and o["op"] == "linear" for o in p["lower_precision_ops"]), p)
        g = python_inputs(os.path.join(_TMP, "py_plan_gru1"), 1, model_factory=GRU)
        self.assertTrue(reference.run_reference(g, pieces=False)["precision"]["float64_throughout"])

    def test_clipping_scales_the_step_not_the_grads_artifact(self):
        d = python_inputs(os.path.join(_TMP, "py_plan_clip"), 1)
        plain = reference.run_reference(d, out=os.path.join(d, "plain"), pieces=False)
        edit_plan(d, lambda p: p["spec"]["optimizer"].update(max_grad_norm=0.5))
        clipped = reference.run_reference(d, out=os.path.join(d, "clipped"), pieces=False)
        u0 = clipped["updates"][0]
        self.assertLess(u0["clip_coef"], 1.0)
        self.assertAlmostEqual(u0["clip_coef"], 0.5 / (u0["grad_norm"] + 1e-6), delta=1e-15)
        self.assertEqual(worst(os.path.join(d, "plain"), os.path.join(d, "clipped"), "grads", 0), 0.0)
        self.assertGreater(worst(os.path.join(d, "plain"), os.path.join(d, "clipped"), "params", 0), 1e-6)
        self.assertEqual(plain["updates"][0]["clip_coef"], 1.0)


# --------------------------------------------------------------------------------------
# Adapters against the reference
# --------------------------------------------------------------------------------------


@needs_torchrun
class AdapterTest(unittest.TestCase):
    def test_b_gru_lm_through_torch_ddp_world2_matches_the_reference(self):
        d = inputs("gru_w2", 2)
        edit_plan(d, lambda p: p["spec"]["model"].update(factory=GRU))
        plan = client.Plan.load(os.path.join(d, "plan.json"))
        initial.write_initial(GRU, plan.spec["seed"], "float64", os.path.join(d, "initial.safetensors"))
        last = plan.window(len(plan) - 1)
        self.assertTrue(last["partial"])
        stack = os.path.join(d, "stack")
        m = run_adapter("torch_ddp.py", d, stack, 2)
        ref = reference.run_reference(d)  # the plan names the factory
        self.assertEqual(ref["reference"]["factory"], GRU)
        figures = []
        for u, (s, r) in enumerate(zip(m["updates"], ref["updates"])):
            self.assertEqual(s["valid_targets"], r["valid_targets"])
            self.assertAlmostEqual(s["loss"], r["loss"], delta=1e-10 * r["loss"])
            for kind in ("grads", "params"):
                figures.append(worst(stack, os.path.join(d, "reference"), kind, u))
                self.assertLessEqual(figures[-1], 1e-10, (u, kind))
        print(f"\n[ figure ] GRU LM, torch-ddp world 2 vs python reference: max rel L2 {max(figures):.3g} "
              f"({'gradcert' if HAVE_EXE else 'python'} plan)")
        for g in range(2):
            with open(os.path.join(stack, f"rank{g}.json")) as f:
                got = [u["consumed"] for u in json.load(f)["updates"]]
            self.assertEqual(got, [plan.ids(u, g) for u in range(len(plan))])
        again = reference.run_reference(d, out=os.path.join(d, "ref_from_ranks"), pieces=False, ids_from_ranks=stack)
        for a, b in zip(again["updates"], ref["updates"]):  # same ids, concatenated in rank order
            self.assertAlmostEqual(a["loss"], b["loss"], delta=1e-14)

    def test_clipping_in_the_adapter_matches_the_reference(self):
        d = inputs("clip_w2", 2)
        edit_plan(d, lambda p: p["spec"]["optimizer"].update(max_grad_norm=0.5, momentum=0.9))
        stack = os.path.join(d, "stack")
        run_adapter("torch_ddp.py", d, stack, 2)
        ref = reference.run_reference(d, pieces=False)
        self.assertTrue(any(u["clip_coef"] < 1 for u in ref["updates"]))
        figures = []
        for u in range(len(ref["updates"])):
            for kind in ("grads", "params"):
                figures.append(worst(stack, os.path.join(d, "reference"), kind, u))
                self.assertLessEqual(figures[-1], 1e-10, (u, kind))
        print(f"\n[ figure ] torch-ddp world 2 with max_grad_norm 0.5 (clip coefs "
              f"{[round(u['clip_coef'], 3) for u in ref['updates']]}) vs reference: max rel L2 {max(figures):.3g}")


@needs_torchrun
class CheckpointTest(unittest.TestCase):
    """gradcert.ref.checkpoint / dcp_export without a process group (NOTE [stack checkpoints]);
    the torchrun legs are gradcert's ConformanceExternalResume tests."""

    def test_dcp_keys_map_to_gradcert_names(self):
        from gradcert.ref import dcp_export

        self.assertEqual(dcp_export.canonical("model.blocks.0.fc.weight"), ("param", "blocks.0.fc.weight"))
        self.assertEqual(dcp_export.canonical("optim.state.wte.weight.exp_avg_sq"), ("slot", "wte.weight", "v"))
        self.assertEqual(dcp_export.canonical("optim.state.wte.weight.momentum_buffer"), ("slot", "wte.weight", "m"))
        self.assertEqual(dcp_export.canonical("optim.state.ln_f.bias.step"), ("step", "ln_f.bias"))
        self.assertIsNone(dcp_export.canonical("optim.param_groups.0.lr"))

    def test_resume_environment_is_checked(self):
        from gradcert.ref import checkpoint

        self.assertFalse(checkpoint.Resume({}).active)
        with self.assertRaisesRegex(client.ProtocolError, "GRADCERT_SAVE_AT='two': expected an update count"):
            checkpoint.Resume({"GRADCERT_SAVE_AT": "two", "GRADCERT_SAVE_DIR": "/x"})
        with self.assertRaisesRegex(client.ProtocolError, "GRADCERT_SAVE_DIR is not"):
            checkpoint.Resume({"GRADCERT_SAVE_AT": "2"})

    def _saved(self, steps):
        import torch.distributed.checkpoint as dcp
        from gradcert.ref import checkpoint

        d = tempfile.mkdtemp(prefix="gradcert_dcp_", dir=_TMP)
        state = {"model": {"w": torch.arange(6.0, dtype=torch.float64).reshape(2, 3)},
                 "optim": {"state": {"w": {"exp_avg": torch.ones(2, 3, dtype=torch.float64),
                                           "step": torch.tensor(float(steps[0]))}}}}
        if len(steps) > 1:
            state["model"]["b"] = torch.zeros(3, dtype=torch.float64)
            state["optim"]["state"]["b"] = {"step": torch.tensor(float(steps[1]))}
        dcp.save(state, checkpoint_id=d, no_dist=True)
        client.write_json(os.path.join(d, checkpoint.MANIFEST), {
            "schema": checkpoint.SCHEMA, "format": checkpoint.FORMAT, "backend": "t", "world": 2, "updates_done": 2,
            "optimizer_step": 2, "sampler": {"epoch": 0, "index_in_epoch": 2}, "save_seconds": 0.5, "nonce": "n"})
        return d

    def test_export_names_a_rank_without_files_and_reads_what_is_there(self):
        from gradcert.ref import dcp_export

        d = self._saved([2])
        out = os.path.join(d, "export")
        rec = dcp_export.export(d, out, 2, "n")
        self.assertEqual((rec["optimizer_step"], rec["save_seconds"]), (2, 0.5))
        self.assertTrue(os.path.exists(os.path.join(out, "rank0.safetensors")))
        self.assertFalse(os.path.exists(os.path.join(out, "rank1.safetensors")))  # rank 1 wrote no __1_*.distcp
        t = load_file(os.path.join(out, "rank0.safetensors"))
        self.assertTrue(torch.equal(t["param.w"], torch.arange(6.0, dtype=torch.float64).reshape(2, 3)))
        self.assertTrue(torch.equal(t["optim.w.m"], torch.ones(2, 3, dtype=torch.float64)))
        with self.assertRaisesRegex(client.ProtocolError, "nonce 'n' is not this run's"):
            dcp_export.export(d, out, 2, "other")

    def test_export_refuses_step_counters_that_differ(self):
        from gradcert.ref import dcp_export

        d = self._saved([2, 0])
        with self.assertRaisesRegex(client.ProtocolError, "the saved step counters differ: 'b' has 0.0, 'w' has 2.0"):
            dcp_export.export(d, os.path.join(d, "export"), 2, "n")


class MutantTest(unittest.TestCase):
    """(c) Each mutant changes the gradient, first at the update it should (0, or the
    partial window), and there equals its candidate objective built from the reference's
    pieces (mutants.coefficients) to 1e-10."""

    @classmethod
    def setUpClass(cls):
        cls.d = inputs("mutants_w2", 2)
        cls.plan = client.Plan.load(os.path.join(cls.d, "plan.json"))
        cls.ref_manifest = reference.run_reference(cls.d)
        cls.ref = os.path.join(cls.d, "reference")

    def check_mutant(self, mutant):
        out = os.path.join(self.d, "stack-" + mutant)
        m = run_adapter("torch_ddp.py", self.d, out, 2, ["--mutant", mutant])
        self.assertEqual(m["backend"], f"torch-ddp+mutant={mutant}")
        last = len(self.plan) - 1
        errors = [worst(out, self.ref, "grads", u) for u in range(len(self.plan))]
        first = next(u for u, e in enumerate(errors) if e > 1e-8)
        expect = last if mutant in ("partial-nominal-accum", "drop-partial-window") else 0
        self.assertEqual(first, expect, errors)
        self.assertTrue(all(e <= 1e-10 for e in errors[:first]), errors)
        with open(os.path.join(self.ref, f"u{first}.pieces.json")) as f:
            meta = json.load(f)
        coef = mutants.coefficients(mutant, meta["pieces"], self.plan.dp, self.plan.accum, meta["partial"])
        pieces = load_file(os.path.join(self.ref, f"u{first}.pieces.safetensors"))
        stack = load_file(os.path.join(out, f"u{first}.grads.safetensors"))
        fit = 0.0
        for n, g in stack.items():
            cand = sum(c * pieces[f"r{r}.a{a}.{n}"] for (r, a), c in coef.items())
            fit = max(fit, rel_l2(g, cand) if float(cand.norm()) > 0 else float(g.abs().max()))
        self.assertLessEqual(fit, 1e-10)
        print(f"\n[ figure ] mutant {mutant}: grad rel L2 vs reference {errors[first]:.3g} at update {first}; "
              f"vs its candidate objective {fit:.3g}")
        return m, out

    def test_local_mean(self):
        self.check_mutant("local-mean")

    def test_micro_mean(self):
        self.check_mutant("micro-mean")

    def test_partial_nominal_accum(self):
        self.check_mutant("partial-nominal-accum")

    def test_grad_scale(self):
        self.check_mutant("grad-scale-1.05")

    def test_unshifted_count(self):
        m, _ = self.check_mutant("unshifted-count")
        ds = client.Dataset.load(os.path.join(self.d, "dataset.json"))
        ids = self.plan.window(0)["ids"]
        self.assertEqual(m["updates"][0]["valid_targets"], self.plan.window_targets(0) + ds.rows_with_targets(ids))

    def test_drop_partial_window(self):
        m, out = self.check_mutant("drop-partial-window")
        last = len(self.plan) - 1
        grads = load_file(os.path.join(out, f"u{last}.grads.safetensors"))
        self.assertTrue(all(float(g.abs().max()) == 0.0 for g in grads.values()))
        a = load_file(os.path.join(out, f"u{last}.params.safetensors"))
        b = load_file(os.path.join(out, f"u{last - 1}.params.safetensors"))
        self.assertTrue(all(torch.equal(a[n], b[n]) for n in a))
        self.assertEqual((m["updates"][last]["loss"], m["updates"][last]["valid_targets"]), (0.0, 0))

    @unittest.skipUnless(HAVE_EXE and os.environ.get("GRADCERT_TEST_CERTIFY") == "1",
                         "set GRADCERT_TEST_CERTIFY=1 (and build gradcert) to run gradcert on every mutant")
    def test_gradcert_catches_every_mutant(self):
        for mutant in mutants.MUTANTS:
            cmd = subprocess.run(["sh", os.path.join(PY, "command.sh"), "torch-ddp", "--mutant", mutant],
                                 capture_output=True, text=True, check=True).stdout.strip()
            resume = ["--optimizer", "adamw", "--resume-at", "1"] if mutant in mutants.RESUME_MUTANTS else []
            p = subprocess.run([EXE, "run", "--backend", "external", "--world", "2", "--command", cmd, *resume,
                                "--out", os.path.join(_TMP, "certify-" + mutant)], capture_output=True, text=True,
                               timeout=300)
            failed = [l.split()[6] for l in p.stdout.splitlines()
                      if not l.startswith("#") and l.split()[-1:] == ["fail"] and len(l.split()) > 6]
            print(f"\n[ figure ] gradcert run, torch-ddp --mutant {mutant}: exit {p.returncode}, failed: {failed}")
            self.assertEqual(p.returncode, 1, p.stdout[-2000:] + p.stderr[-2000:])


if __name__ == "__main__":
    unittest.main()
