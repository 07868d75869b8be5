#!/bin/sh
# Prints the `gradcert run --backend external --command` string of a PyTorch adapter.
#   backends/python/command.sh torch-ddp|torch-fsdp1|torch-fsdp2 [adapter flags, e.g. --wrong local-mean]
# Example:
#   ./build/gradcert run --backend external --world 2 --command "$(backends/python/command.sh torch-fsdp2)"
# $GRADCERT_NPROC and $GRADCERT_MASTER_PORT stay literal: gradcert sets them for the command.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
name=${1:?usage: command.sh torch-ddp|torch-fsdp1|torch-fsdp2 [adapter flags]}
shift
case "$name" in
  torch-ddp) script=torch_ddp.py ;;
  torch-fsdp1) script=torch_fsdp1.py ;;
  torch-fsdp2) script=torch_fsdp2.py ;;
  *) echo "command.sh: unknown adapter '$name' (torch-ddp, torch-fsdp1, torch-fsdp2)" >&2; exit 2 ;;
esac
printf '%s' "$root/.venv/bin/torchrun --nproc_per_node=\$GRADCERT_NPROC --master_addr=127.0.0.1 --master_port=\$GRADCERT_MASTER_PORT $root/backends/python/$script"
[ $# -gt 0 ] && printf ' %s' "$@"
printf '\n'
