"""gradcert's Python side: the client library stacks use (client), model factories
(factory), the float64 reference runner for a user's own PyTorch model (reference), the
initial-weights writer (initial), the adapters' planted bugs (mutants) and the candidate
objectives a diagnosis compares a failing gradient with (candidates).

Import it with backends/python on sys.path:

    sys.path.insert(0, "<gradcert>/backends/python")
    from gradcert_ref import client, factory

Protocol: backends/PROTOCOL.md (version 1).
"""

PROTOCOL_VERSION = 1
