#!/bin/sh
# Prints the `gradcert run --backend external --command` string of a PyTorch adapter.
#   backends/python/command.sh NAME [adapter flags, e.g. --mutant local-mean]
# NAME: an adapter's name or alias from adapters.json (torch-ddp, torch-fsdp1 = fsdp1,
# torch-fsdp2 = fsdp2). An unknown name exits 2 listing the known ones.
# Example:
#   ./build/gradcert run --backend external --world 2 --command "$(backends/python/command.sh torch-fsdp2)"
# $GRADCERT_NPROC and $GRADCERT_MASTER_PORT stay literal: gradcert sets them for the command.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
name=${1:?usage: command.sh NAME [adapter flags] (NAME: an adapter of backends/python/adapters.json)}
shift
# GRADCERT_VENV: the venv whose torchrun runs the adapter (default .venv; .venv-cuda on a GPU).
venv=${GRADCERT_VENV:-$root/.venv}
py=python3
[ -x "$venv/bin/python" ] && py="$venv/bin/python"
# Prints the adapter's script, or the known names on stderr and exits 2.
script=$("$py" - "$here/adapters.json" "$name" <<'PY'
import json, sys
path, name = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        catalog = json.load(f)
    adapters = catalog["adapters"]
except (OSError, ValueError, KeyError) as e:
    sys.stderr.write("command.sh: cannot read the adapter catalog %s: %s\n" % (path, e))
    sys.exit(2)
known = []
for a in adapters:
    names = [a["name"]] + list(a.get("aliases", []))
    known.append(a["name"] + (" (" + ", ".join(a["aliases"]) + ")" if a.get("aliases") else ""))
    if name in names:
        print(a["script"])
        sys.exit(0)
sys.stderr.write("command.sh: unknown adapter '%s' (known: %s)\n" % (name, ", ".join(known)))
sys.exit(2)
PY
) || exit 2
printf '%s' "$venv/bin/torchrun --nproc_per_node=\$GRADCERT_NPROC --master_addr=127.0.0.1 --master_port=\$GRADCERT_MASTER_PORT $root/backends/python/$script"
[ $# -gt 0 ] && printf ' %s' "$@"
printf '\n'
