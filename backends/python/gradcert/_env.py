"""The protocol's environment variables as the Python side reads them: one list, the same strings
as conformance/protocol/variables.hpp (a test holds the two equal), plus the test bed's own.

Torch-free: `import gradcert` reads OBSERVE_DIR before any integration is used.
"""

# A stack's command (--backend external): where its run folder and inputs are.
RUN_DIR = "GRADCERT_RUN_DIR"
PLAN = "GRADCERT_PLAN"
DATASET = "GRADCERT_DATASET"
INIT = "GRADCERT_INIT"
OUT = "GRADCERT_OUT"
NPROC = "GRADCERT_NPROC"
MASTER_PORT = "GRADCERT_MASTER_PORT"
SAMPLER = "GRADCERT_SAMPLER"  # "plan" | "own" (--sampler-audit)
DEVICE = "GRADCERT_DEVICE"  # "cpu" | "cuda" (NOTE [device])
RUN_NONCE = "GRADCERT_RUN_NONCE"  # NOTE [run nonce]
# A resumed run's legs (NOTE [resume]).
SAVE_AT = "GRADCERT_SAVE_AT"
SAVE_DIR = "GRADCERT_SAVE_DIR"
RESUME_FROM = "GRADCERT_RESUME_FROM"
# An observed job (gradcert observe).
OBSERVE_DIR = "GRADCERT_OBSERVE_DIR"
OBSERVE_UPDATES = "GRADCERT_OBSERVE_UPDATES"
OBSERVE_KEEP_DROPOUT = "GRADCERT_OBSERVE_KEEP_DROPOUT"
# gradcert's own: the checkout and a planted rank fault (tests).
ROOT = "GRADCERT_ROOT"
FAULT = "GRADCERT_FAULT"

PROTOCOL = (RUN_DIR, PLAN, DATASET, INIT, OUT, NPROC, MASTER_PORT, SAMPLER, DEVICE, RUN_NONCE, SAVE_AT, SAVE_DIR,
            RESUME_FROM, OBSERVE_DIR, OBSERVE_UPDATES, OBSERVE_KEEP_DROPOUT, ROOT, FAULT)

# The test bed's (backends/python/testbed, not the protocol): the adapters' optimizer code path.
PY_OPTIM = "GRADCERT_PY_OPTIM"
