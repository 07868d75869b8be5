#!/usr/bin/env bash
# One `ctest -L gpu` case (NOTE [device]). Where the gradcert binary under test finds no CUDA
# device it exits 77 (CTest's skip) and says why; on a GPU every case runs and must pass.
#   conformance/tests/gpu_case.sh GRADCERT_EXE CASE
# CASE: refusal (runs everywhere: without CUDA `--device cuda` exits 2 with one line and leaves
#       an earlier report as it was; on a GPU machine the same with CUDA_VISIBLE_DEVICES=""),
#       adapter-ddp | adapter-fsdp2 (the PyTorch adapter on cuda at float64 and float32: NCCL with
#       a GPU per rank, Gloo on CUDA tensors when 2 ranks share one GPU; the report must name the
#       device and the CUDA allocator's peak), observe-ddp (examples/observe/ddp_loop.py --device cuda
#       under gradcert observe --device cuda, one rank per GPU, at most 2).
# The Python side runs in GRADCERT_VENV (default .venv-cuda: scripts/bootstrap --cuda).
set -uo pipefail
exe=${1:?usage: gpu_case.sh GRADCERT_EXE CASE}
case=${2:?usage: gpu_case.sh GRADCERT_EXE CASE}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL ($case): $*"; for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done; exit 1; }
probe=$("$exe" devices | grep '^cuda:') || fail "gradcert devices printed no cuda line"
echo "$probe"
gpus=0
[[ $probe == "cuda: unavailable:"* ]] || gpus=$(echo "$probe" | awk '{print $2}')

case $case in
  refusal)
    mkdir -p "$tmp/out"
    echo '{"sentinel": "an earlier report"}' > "$tmp/out/report.json"
    if [ "$gpus" -eq 0 ]; then
      "$exe" run --device cuda --out "$tmp/out" > "$tmp/stdout.log" 2> "$tmp/stderr.log"
      rc=$?
      [ $rc -eq 2 ] || fail "gradcert run --device cuda exited $rc, expected 2"
      [ "$(wc -l < "$tmp/stderr.log")" -eq 1 ] || fail "expected one line on stderr"
      grep -q '^gradcert: --device cuda: ' "$tmp/stderr.log" || fail "the line does not name --device cuda"
      [ ! -s "$tmp/stdout.log" ] || fail "stdout is not empty"
      grep -q sentinel "$tmp/out/report.json" || fail "the earlier report was touched"
      [ "$(ls -A "$tmp/out" | wc -l)" -eq 1 ] || fail "the refused run wrote into --out: $(ls -A "$tmp/out")"
      # the spec's device is refused alike, naming the spec file
      echo '{"device": "cuda"}' > "$tmp/cuda.json"
      "$exe" run --spec "$tmp/cuda.json" --out "$tmp/out" 2> "$tmp/spec.log"
      rc=$?
      [ $rc -eq 2 ] && grep -q "cuda.json: device cuda: " "$tmp/spec.log" || fail "the spec's device cuda: exit $rc, $(cat "$tmp/spec.log")"
      echo "refused as it must be: $(cat "$tmp/stderr.log")"
    else
      # A GPU machine: the same refusal with every device hidden (the probe names CUDA_VISIBLE_DEVICES).
      CUDA_VISIBLE_DEVICES="" "$exe" run --device cuda --out "$tmp/out" > "$tmp/stdout.log" 2> "$tmp/stderr.log"
      rc=$?
      [ $rc -eq 2 ] || fail "gradcert run --device cuda with CUDA_VISIBLE_DEVICES='' exited $rc, expected 2"
      grep -q "CUDA_VISIBLE_DEVICES" "$tmp/stderr.log" || fail "the refusal does not name CUDA_VISIBLE_DEVICES: $(cat "$tmp/stderr.log")"
      grep -q sentinel "$tmp/out/report.json" || fail "the earlier report was touched"
      echo "refused as it must be: $(cat "$tmp/stderr.log")"
    fi
    ;;
  adapter-ddp|adapter-fsdp2)
    [ "$gpus" -gt 0 ] || { echo "skipped: no CUDA device (${probe#cuda: unavailable: })"; exit 77; }
    venv=${GRADCERT_VENV:-$root/.venv-cuda}
    [ -x "$venv/bin/torchrun" ] || fail "$venv has no torchrun: scripts/bootstrap --cuda"
    adapter=torch-${case#adapter-}
    for dtype in float64 float32; do
      GRADCERT_VENV=$venv "$exe" run --device cuda --backend external --world 2 --dtype "$dtype" \
        --command "$(GRADCERT_VENV=$venv "$root/backends/python/command.sh" "$adapter")" --out "$tmp/$dtype" \
        > "$tmp/$dtype.log" 2>&1 || fail "$adapter on cuda at $dtype did not pass"
      grep -q '"device cuda:' "$tmp/$dtype/report.json" 2>/dev/null || grep -q 'device cuda:' "$tmp/$dtype/report.json" ||
        fail "the report does not name the CUDA device"
      grep -q 'CUDA caching allocator' "$tmp/$dtype/report.json" || fail "the report's memory is not the CUDA allocator's"
      grep -E "grad.parity|device cuda" "$tmp/$dtype.log" | head -3
    done
    ;;
  observe-ddp)
    [ "$gpus" -gt 0 ] || { echo "skipped: no CUDA device (${probe#cuda: unavailable: })"; exit 77; }
    venv=${GRADCERT_VENV:-$root/.venv-cuda}
    n=$(( gpus < 2 ? gpus : 2 ))
    "$exe" observe --device cuda --out "$tmp/obs" -- "$venv/bin/torchrun" --standalone --nproc_per_node "$n" \
      "$root/examples/observe/ddp_loop.py" --device cuda --dtype float64 > "$tmp/observe.log" 2>&1 ||
      fail "observe of ddp_loop.py on cuda did not pass"
    grep -E "grad.parity|observing cost" "$tmp/observe.log" | head -3
    ;;
  *) fail "unknown case '$case' (refusal, adapter-ddp, adapter-fsdp2, observe-ddp)" ;;
esac
