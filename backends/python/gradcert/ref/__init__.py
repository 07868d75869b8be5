"""gradcert.ref: the client library stacks use to speak backends/PROTOCOL.md (client), model
factories (factory), the float64 reference runner for a user's own PyTorch model
(reference), the initial-weights writer (initial), stack checkpoints (checkpoint: the
environment and gradcert.json; dcp_export). The adapters' planted bugs and their own
checkpoint legs are the test bed's (backends/python/testbed/), not installed.

    from gradcert.ref import client, factory

Installed with the `gradcert` package (`pip install <checkout>`; scripts/bootstrap
installs it into .venv, editable, without the CLI). Protocol: backends/PROTOCOL.md.
"""

PROTOCOL_VERSION = 2  # backends/PROTOCOL.md: the version the client speaks (manifest "versions")
