"""gradcert.ref: the client library stacks use to speak backends/PROTOCOL.md (client), model
factories (factory), the float64 reference runner for a user's own PyTorch model
(reference), the initial-weights writer (initial), the adapters' planted bugs and the
candidate objectives a diagnosis compares a failing gradient with (mutants), stack
checkpoints (checkpoint, dcp_export).

    from gradcert.ref import client, factory

Installed with the `gradcert` package (`pip install ./backends/python`; scripts/bootstrap
installs it into .venv, editable). Protocol: backends/PROTOCOL.md.
"""

PROTOCOL_VERSION = 1
