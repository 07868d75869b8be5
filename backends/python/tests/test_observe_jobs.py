"""Unit tests of what `gradcert observe` learns from a job beyond its forward's arguments: the targets
of a loss computed outside the model (gradcert._loss_targets) and the job's own module pickled for
the reference (gradcert._job_module). The jobs end to end: conformance/tests/test_observe_jobs.cpp.
CTest: Observe.package (label observe)."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

from gradcert import _job_module, _loss_targets
from gradcert._loss_targets import IGNORE, Waiting, assign


def waiting(logits):
    w = Waiting(None, None, None, None)
    w.logits = logits
    return w


class LossTargetsTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.B, self.T, self.V = 3, 7, 11
        self.logits = torch.randn(self.B, self.T, self.V, dtype=torch.float64)
        self.labels = torch.randint(0, self.V, (self.B, self.T))
        self.labels[1, 4:] = IGNORE
        self.expect = torch.full((self.B, self.T), IGNORE)
        self.expect[:, :-1] = self.labels[:, 1:]

    def check(self, inp, tg, kind="cross_entropy"):
        w = waiting(self.logits)
        self.assertIs(assign([w], inp, tg, ignore_index=IGNORE, kind=kind, call="c"), w)
        self.assertTrue(torch.equal(w.targets.view(self.B, self.T), self.expect))

    def test_a_shifted_slice_reshaped_and_upcast_names_its_positions(self):
        V = self.V
        self.check(self.logits[:, :-1].reshape(-1, V), self.labels[:, 1:].reshape(-1))
        self.check(self.logits[:, :-1].float().reshape(-1, V), self.labels[:, 1:].reshape(-1))

    def test_a_class_dim_first_call_and_a_log_softmax_for_nll_loss(self):
        self.check(self.logits[:, :-1].transpose(1, 2), self.labels[:, 1:])
        self.check(F.log_softmax(self.logits[:, :-1].float(), -1).reshape(-1, self.V), self.labels[:, 1:].reshape(-1),
                   kind="nll_loss")

    def test_other_tensors_are_not_the_lm_loss_and_a_partial_match_is_refused(self):
        w = waiting(self.logits)
        self.assertIsNone(assign([w], torch.randn(5, self.V), torch.randint(0, self.V, (5,)), ignore_index=IGNORE,
                                 kind="cross_entropy", call="aux"))
        self.assertIsNone(w.targets)
        mixed = torch.cat([self.logits[0, :3], torch.randn(2, self.V, dtype=torch.float64)])
        with self.assertRaisesRegex(LookupError, "2 of its 5 target rows are not rows of the forward's logits"):
            assign([w], mixed, torch.zeros(5, dtype=torch.long), ignore_index=IGNORE, kind="cross_entropy", call="c")

    def test_the_same_positions_targeted_twice_are_refused(self):
        w = waiting(self.logits)
        inp, tg = self.logits[:, :-1].reshape(-1, self.V), self.labels[:, 1:].reshape(-1)
        assign([w], inp, tg, ignore_index=IGNORE, kind="cross_entropy", call="c")
        with self.assertRaisesRegex(LookupError, "already targeted"):
            assign([w], inp, tg, ignore_index=IGNORE, kind="cross_entropy", call="c")

    def test_label_smoothing_and_class_weights_are_refused_by_name(self):
        self.assertIn("label smoothing", _loss_targets.refuse_options("cross_entropy", {"label_smoothing": 0.1}))
        self.assertIn("class weights", _loss_targets.refuse_options("cross_entropy", {"weight": torch.ones(3)}))
        self.assertIsNone(_loss_targets.refuse_options("cross_entropy", {"label_smoothing": 0.0, "weight": None}))


class JobModuleTest(unittest.TestCase):
    def test_a_scripts_own_module_is_rebuilt_in_another_process_without_hooks(self):
        script = textwrap.dedent("""
            import sys, torch, torch.nn as nn
            sys.path.insert(0, sys.argv[2])
            from gradcert import _job_module
            SCALE = 3
            class Net(nn.Module):
                def __init__(self, d):
                    super().__init__()
                    self.lin = nn.Linear(d, d)
                    self.emb = nn.Embedding(d, d)
                    self.out = nn.Linear(d, d, bias=False)
                    self.out.weight = self.emb.weight  # tied, as nanoGPT / GPT-2 heads are
                    self.register_buffer("mask", torch.arange(d) * SCALE)
                def forward(self, x):
                    return self.lin(x) + self.mask
            if __name__ == "__main__":
                m = Net(4)
                m.register_forward_hook(lambda *a: None)
                print(_job_module.save(m, sys.argv[1], {}, lambda mod: False))
        """)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "job.py")
            with open(path, "w") as f:
                f.write(script)
            out = subprocess.run([sys.executable, path, d, os.path.dirname(_job_module.__file__) + "/.."],
                                 capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("Net (from its script)", out.stdout)
            m = _job_module.load(os.path.join(d, _job_module.PICKLE))
            self.assertEqual(type(m).__name__, "Net")
            self.assertEqual([n for n, _ in m.named_parameters()], ["lin.weight", "lin.bias", "emb.weight"])
            self.assertIs(m.out.weight, m.emb.weight)
            self.assertEqual(m.mask.tolist(), [0, 3, 6, 9])
            self.assertEqual(len(m._forward_hooks), 0)
            self.assertFalse(any(p.is_meta for p in m.parameters()))
            self.assertEqual(m(torch.zeros(1, 4)).shape, (1, 4))


if __name__ == "__main__":
    unittest.main()
