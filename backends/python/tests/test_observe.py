"""Tests of the `gradcert observe` integrations' recorder (gradcert.observe, gradcert._observe_facts):
what it reads off a job's objects and inputs, and what one rank records, in a one-process job
(world 1, no torchrun). The whole path under `gradcert observe` (every example, bugs and their
diagnosis, failing jobs) is conformance/tests/test_observe.cpp. CTest: Observe.package (label observe).
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

import gradcert
from gradcert import _observe_facts as facts
from gradcert.observe import ObserveError

PY = sys.executable


class OutsideObserveTest(unittest.TestCase):
    def test_watch_is_a_falsy_no_op_outside_gradcert_observe(self):
        env = os.environ.pop("GRADCERT_OBSERVE_DIR", None)
        try:
            m = nn.Linear(2, 2)
            h = gradcert.watch(m, torch.optim.SGD(m.parameters(), lr=0.1))
            self.assertFalse(h)
            h.capture_grads()
            h.close()
            self.assertFalse(gradcert.observing())
        finally:
            if env is not None:
                os.environ["GRADCERT_OBSERVE_DIR"] = env


class InputsTest(unittest.TestCase):
    def test_hf_labels_are_shifted_and_shifted_ones_kept(self):
        labels = torch.tensor([[5, 6, 7, -100]])
        self.assertEqual(facts.shifted_targets(labels, "hf").tolist(), [[6, 7, -100, -100]])
        self.assertEqual(facts.shifted_targets(labels, "shifted").tolist(), labels.tolist())

    def test_rows_cut_right_padding_and_refuse_left_padding_and_packing(self):
        ids = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0]])
        tg = torch.tensor([[4, 5, -100, -100], [7, -100, -100, -100]])
        mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
        self.assertEqual(facts.example_rows(ids, tg, mask, None), [([3, 4, 5], [4, 5, -100]), ([6, 7], [7, -100])])
        with self.assertRaisesRegex(ObserveError, "left padding"):
            facts.example_rows(ids, tg, torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]]), None)
        with self.assertRaisesRegex(ObserveError, "position_ids"):
            facts.example_rows(ids, tg, None, torch.tensor([[0, 1, 0, 1], [0, 1, 2, 3]]))

    def test_equal_content_is_one_identity(self):
        a = facts.example_key([1, 2, 3], [2, 3, -100])
        self.assertEqual(a, facts.example_key([1, 2, 3], [2, 3, -100]))
        self.assertNotEqual(a, facts.example_key([1, 2, 3], [2, -100, -100]))


class JobObjectsTest(unittest.TestCase):
    def test_dropout_is_turned_off_and_named_or_refused(self):
        m = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))
        changed = facts.turn_off_dropout(m, keep=False)
        self.assertEqual(changed, [{"module": "1", "type": "Dropout", "p": 0.1}])
        self.assertEqual(m[1].p, 0.0)
        with self.assertRaisesRegex(ObserveError, r"--keep-dropout: .*1 p=0.2"):
            facts.turn_off_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.2)), keep=True)

    def test_wrapped_optimizers_are_unwrapped_even_when_they_subclass_optimizer(self):
        m = nn.Linear(2, 2)
        inner = torch.optim.AdamW(m.parameters())

        class Accelerated(torch.optim.Optimizer):  # accelerate's AcceleratedOptimizer: no base __init__
            def __init__(self, optimizer):
                self.optimizer = optimizer

            @property
            def param_groups(self):
                return self.optimizer.param_groups

        self.assertIs(facts.unwrap_optimizer(Accelerated(inner)), inner)
        with self.assertRaisesRegex(ObserveError, "not a torch.optim.Optimizer"):
            facts.unwrap_optimizer(object())

    def test_factories_are_named_as_the_reference_can_import_them(self):
        from gradcert.tiny_lm import tiny_lm

        self.assertEqual(facts.factory_string(tiny_lm), "gradcert.tiny_lm:tiny_lm")
        self.assertEqual(facts.factory_string("x.py:f"), "x.py:f")
        with self.assertRaisesRegex(ObserveError, "lambda"):
            facts.factory_string(lambda v, n: None)

    def test_max_len_and_loader_facts(self):
        class Cfg:
            n_positions = 64

        m = nn.Linear(2, 2)
        self.assertEqual(facts.model_max_len(m), 0)
        m.config = Cfg()
        self.assertEqual(facts.model_max_len(m), 64)
        loader = DataLoader(list(range(10)), batch_size=2)
        self.assertEqual(facts.loader_facts(loader, 3)["expect_batch"], 6)
        self.assertEqual(facts.loader_facts(loader, 3)["windows_per_epoch"], 2)  # 5 batches, A 3
        self.assertEqual(facts.loader_facts(loader, 3)["dataset_size"], 10)
        self.assertEqual(facts.loader_facts(None, 3), {})


# A one-process job: a linear LM over token ids, two micro-batches per update, clipped SGD.
JOB = textwrap.dedent('''
    import sys, torch, torch.nn as nn, torch.nn.functional as F
    import gradcert
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(8, 4), nn.Linear(4, 8)
        def forward(self, input_ids, targets=None):
            return self.head(self.emb(input_ids))
    torch.manual_seed(0)
    model = LM().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    mode = sys.argv[1]
    h = gradcert.watch(model, opt, factory="x.py:f")
    batches = [(torch.tensor([[1, 2, 3]]), torch.tensor([[2, 3, -100]])),
               (torch.tensor([[4, 5, 6, 7]]), torch.tensor([[5, 6, 7, 1]]))]
    for step in range(5):
        def closure():
            for ids, tg in batches:
                F.cross_entropy(model(ids, targets=tg).flatten(0, 1), tg.flatten(), ignore_index=-100,
                                reduction="sum").backward()
            if mode == "capture":
                h.capture_grads()
        if mode == "plain":
            closure()
            torch.save({n: p.grad.clone() for n, p in model.named_parameters()}, sys.argv[2] + f"/g{step}.pt")
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            opt.step()
        else:
            opt.step(closure)
        opt.zero_grad()
''')


class RecorderTest(unittest.TestCase):
    def run_job(self, mode):
        out = tempfile.mkdtemp(prefix="gradcert_observe_test_")
        env = dict(os.environ, GRADCERT_OBSERVE_DIR=out, GRADCERT_OBSERVE_UPDATES="2", GRADCERT_RUN_NONCE="n1")
        r = subprocess.run([PY, "-c", JOB, mode, out], env=env, capture_output=True, text=True, timeout=120)
        return r, out

    def test_a_plain_loop_records_the_gradient_before_clipping_and_ends_after_k_updates(self):
        from safetensors.torch import load_file

        r, out = self.run_job("plain")
        self.assertEqual(r.returncode, 0, r.stderr)
        job = json.load(open(os.path.join(out, "observed.json")))
        self.assertEqual((job["nonce"], job["updates_done"], job["labels"]), ("n1", 2, "shifted"))
        self.assertIn("ended the job after 2 updates", job["status"])
        self.assertEqual(job["model"]["vocab"], 8)
        self.assertFalse(os.path.exists(os.path.join(out, "g2.pt")), "the job ran past K updates")
        for u in range(2):
            rec = json.load(open(os.path.join(out, f"observed.rank0.u{u}.json")))
            self.assertEqual([len(m["examples"]) for m in rec["microsteps"]], [1, 1])
            self.assertEqual(rec["clip"]["max_norm"], 0.01)
            self.assertEqual(rec["groups"][0]["lr"], 0.5)
            recorded = load_file(os.path.join(out, rec["grads"]))
            before_clip = torch.load(os.path.join(out, f"g{u}.pt"))
            for n, g in before_clip.items():
                torch.testing.assert_close(recorded[n], g, rtol=0, atol=0)

    def test_backward_inside_a_closure_is_refused_unless_captured(self):
        r, out = self.run_job("closure")
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("rank 0, update 0: the optimizer ran forwards inside step(closure)", r.stderr)
        err = json.load(open(os.path.join(out, "observed.rank0.error.json")))
        self.assertEqual(err["update"], 0)
        r, out = self.run_job("capture")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "observed.rank0.u1.json")))


if __name__ == "__main__":
    unittest.main()
