"""`gradcert` and `python -m gradcert`: the C++ CLI installed with this package.

NOTE [installed CLI] `pip install <checkout>` builds the CLI against the torch the venv holds and
installs it as gradcert/_bin/gradcert, with gradcert/_bin/build.json saying what it was built
against (written by CMake). LibTorch is found through the installed torch (the binary's RUNPATH
is $ORIGIN/../../torch/lib: site-packages/torch/lib), never through the build tree. A binary
built against another torch would fail in the dynamic loader or, worse, run with a different
ABI, so this launcher compares the installed torch's version (its distribution metadata; torch
is not imported) with the build's before it execs the binary, and refuses a difference in one
line that names both and how to rebuild. The developer flow installs the package without the
CLI (GRADCERT_CLI=OFF) and runs build/gradcert.
"""

from __future__ import annotations

import json
import os
import sys

BIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")
REBUILD = "pip install --force-reinstall --no-deps --no-binary gradcert <checkout or sdist>"


def build_info() -> dict | None:
    """What the installed binary was built against (None: this install has no CLI)."""
    try:
        with open(os.path.join(BIN_DIR, "build.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def installed_torch() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def refusal(info: dict, torch_version: str | None) -> str | None:
    """One line when the venv's torch is not the one the binary was built against, else None."""
    built = info.get("torch", "?")
    if torch_version == built:
        return None
    have = f"torch {torch_version}" if torch_version else "no torch"
    return (f"gradcert: this gradcert {info.get('version', '?')} was built against torch {built}, but this venv "
            f"({sys.prefix}) has {have}: rebuild it here with `{REBUILD}`")


def main(argv: list | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    info = build_info()
    exe = os.path.join(BIN_DIR, "gradcert")
    if info is None or not os.access(exe, os.X_OK):
        sys.stderr.write("gradcert: this install of the gradcert package has no CLI (installed with "
                         "GRADCERT_CLI=OFF, e.g. the developer flow, which runs build/gradcert); "
                         "`pip install <checkout>` builds it\n")
        return 2
    why = refusal(info, installed_torch())
    if why:
        sys.stderr.write(why + "\n")
        return 2
    os.execv(exe, [exe] + list(args))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
