"""Tests of backends/python's float64 reference runner (gradcert.ref.reference) and the
initial-weights writer, against gradcert's C++ artifacts and their own invariants; the
adapters against the reference (a GRU LM through torch-ddp at world 2) and the adapters'
mutants (testbed/mutants.py). The client, factories, catalog and checkpoint export:
test_gradcert_client.py; helpers and inputs: helpers.py.

    .venv/bin/python -m pytest backends/python/tests -q        # or
    .venv/bin/python -m unittest discover -s backends/python/tests -v

Tests that compare with gradcert's C++ artifacts skip without the binary (helpers.HAVE_EXE).
GRADCERT_TEST_CERTIFY=1 also runs `gradcert run --backend external` on every mutant (slow:
~8 s each).
"""

import glob
import json
import os
import subprocess
import unittest

import torch
from helpers import (EXE, GRU, HAVE_EXE, PY, TESTS, edit_plan, inputs, needs_torchrun, python_inputs, rel_l2,
                     run_adapter, scratch, worst)
from helpers import make_tmp as setUpModule  # noqa: F401  (unittest's module fixtures)
from helpers import remove_tmp as tearDownModule  # noqa: F401

from gradcert.ref import client, factory, initial, reference
from safetensors.torch import load_file
from testbed import mutants


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
        single = os.path.join(scratch(), "single_w1")
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
        d = python_inputs(os.path.join(scratch(), "py_plan_at"), 2, model_factory=GRU)
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
        d = python_inputs(os.path.join(scratch(), "py_plan_w2"), 2, model_factory=GRU)
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
        d = python_inputs(os.path.join(scratch(), "py_plan_half"), 1,
                          model_factory=os.path.join(TESTS, "factories.py") + ":half_inside")
        m = reference.run_reference(d, pieces=False)
        p = m["precision"]
        self.assertFalse(p["float64_throughout"])
        self.assertTrue(any(o["dtype"] == "float32" and o["op"] == "linear" for o in p["lower_precision_ops"]), p)
        g = python_inputs(os.path.join(scratch(), "py_plan_gru1"), 1, model_factory=GRU)
        self.assertTrue(reference.run_reference(g, pieces=False)["precision"]["float64_throughout"])

    def test_clipping_scales_the_step_not_the_grads_artifact(self):
        d = python_inputs(os.path.join(scratch(), "py_plan_clip"), 1)
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

    def test_first_and_last_microsteps(self):
        self.check_mutant("first-and-last-microsteps")

    def test_last_microstep_only(self):
        self.check_mutant("last-microstep-only")

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
                                "--out", os.path.join(scratch(), "certify-" + mutant)], capture_output=True, text=True,
                               timeout=300)
            failed = [l.split()[6] for l in p.stdout.splitlines()
                      if not l.startswith("#") and l.split()[-1:] == ["fail"] and len(l.split()) > 6]
            print(f"\n[ figure ] gradcert run, torch-ddp --mutant {mutant}: exit {p.returncode}, failed: {failed}")
            self.assertEqual(p.returncode, 1, p.stdout[-2000:] + p.stderr[-2000:])


if __name__ == "__main__":
    unittest.main()
