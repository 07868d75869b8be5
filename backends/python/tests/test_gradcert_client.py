"""Tests of backends/python's pieces without the reference runner: the protocol client
(datasets, the gradient recorder, shard files), model factories, the adapter catalog and
command.sh, and the stack checkpoint export (gradcert.ref.checkpoint / dcp_export); the
adapters' trainer of the test bed (testbed/trainer.py).
Helpers and inputs: helpers.py; the reference runner, adapters and mutants:
test_gradcert_ref.py.

    .venv/bin/python -m pytest backends/python/tests -q        # or
    .venv/bin/python -m unittest discover -s backends/python/tests -v
"""

import glob
import json
import os
import subprocess
import tempfile
import unittest

import torch
from helpers import PY, REPO, TESTS, needs_torchrun, scratch
from helpers import make_tmp as setUpModule  # noqa: F401  (unittest's module fixtures)
from helpers import remove_tmp as tearDownModule  # noqa: F401

from gradcert.ref import client, factory
from gradcert.tiny_lm import TinyLM
from safetensors.torch import load_file
from testbed import mutants
from testbed import trainer as gm


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

    def test_non_finite_losses_are_written_as_strings(self):
        # JSON has no NaN (NOTE [non-finite values]): Python writes an invalid `NaN` token.
        self.assertEqual([client.measured(x) for x in (1.5, float("nan"), float("inf"), -float("inf"), None)],
                         [1.5, "nan", "inf", "-inf", None])

    def test_hand_optimizer_is_torchs_rule(self):
        # The test bed's HandOptimizer steps through the reference's optimizer_step: three steps of
        # SGD with momentum and decay, and of AdamW, agree with torch.optim at float64 round-off.
        opts = [{"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01},
                {"name": "adamw", "lr": 0.01, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8, "weight_decay": 0.1}]
        for o in opts:
            models = []
            for kind in ("torch", "hand"):
                torch.manual_seed(0)
                model = torch.nn.Linear(3, 2).double()
                opt = gm.make_optimizer(model.parameters(), o, kind)
                torch.manual_seed(1)
                for _ in range(3):
                    opt.zero_grad()
                    model(torch.randn(4, 3, dtype=torch.float64)).pow(2).sum().backward()
                    opt.step()
                models.append(model)
            for (n, a), b in zip(models[0].named_parameters(), models[1].parameters()):
                self.assertLess(float((a - b).abs().max()), 1e-14, (o["name"], n))

    def test_shard_files_are_assembled_from_the_lowest_replica_group(self):
        # (NOTE [shard artifacts]) rank 0 writes rows 0..1 of w as a box and b[0:3] as a flat
        # range; rank 1 the rest, and a second replica group (its own whole copy) that is ignored.
        from safetensors.torch import save_file

        d = tempfile.mkdtemp(prefix="shards_", dir=scratch())
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
        self.assertIsInstance(m, TinyLM)  # the very class the adapters wrap
        self.assertEqual(m.wte.weight.shape, (32, 8))
        self.assertEqual(len(factory.units(m)), 1)
        g = factory.build(f"{self.F}:gru_lm", 40, 24)
        self.assertEqual(g.head.weight.shape, (40, 12))
        self.assertEqual(factory.units(g), [])  # no ModuleList: the root alone
        s = factory.build(f"{self.F}:with_spec", 40, 24, spec={"d_model": 6})
        self.assertEqual(s.seen_spec, {"d_model": 6})
        self.assertIsInstance(factory.build("gradcert.tiny_lm:tiny_lm", 32, 24), TinyLM)

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

        d = tempfile.mkdtemp(prefix="gradcert_dcp_", dir=scratch())
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



if __name__ == "__main__":
    unittest.main()
