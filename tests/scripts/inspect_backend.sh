#!/usr/bin/env bash
# dspark_inspect --backend: the cpu backend runs the tiny fp8 checkpoint (exit 0); the cuda backend, in a build
# that has it, runs the bf16 one and refuses the fp8 one with exit 1, naming mtp.0.main_proj.weight (the first
# quantised tensor of the table) and fp8 block in stderr, the table and the JSON; a build without it says so.
# Usage: inspect_backend.sh BUILD_DIR HAVE_CUDA(0|1)
set -euo pipefail
build=$1 have_cuda=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
inspect=$build/apps/dspark_inspect
"$build/apps/dspark_make_ckpt" --preset tiny --out "$work/bf16" 2>/dev/null
"$build/apps/dspark_make_ckpt" --preset tiny --format fp8 --out "$work/fp8" 2>/dev/null

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# run RC ARGS...: dspark_inspect ARGS exits RC; stdout in $work/out, stderr in $work/err.
run() {
  local want=$1 rc=0
  shift
  "$inspect" "$@" >"$work/out" 2>"$work/err" || rc=$?
  [ "$rc" -eq "$want" ] || fail "dspark_inspect $* exited $rc, expected $want: $(cat "$work/err")"
}

run 0 "$work/fp8" --tp 2
grep -q "backend cpu: runs every tensor as stored (dense, fp8 block, fp4)" "$work/out" || fail "cpu line: $(cat "$work/out")"
grep -q "1     1.49 MB  1.57 MB + 1.54 kB  2.36 MB + 147.46 kB" "$work/out" || fail "bytes by format: $(cat "$work/out")"

if [ "$have_cuda" = 1 ]; then
  run 0 "$work/bf16" --tp 2 --backend cuda
  grep -q "backend cuda: runs every tensor as stored (dense)" "$work/out" || fail "cuda on bf16: $(cat "$work/out")"
  run 1 "$work/fp8" --tp 2 --backend cuda --json "$work/report.json"
  grep -q "tensor 'mtp.0.main_proj.weight' is stored fp8 block, a format the cuda backend does not run" "$work/err" ||
    fail "stderr: $(cat "$work/err")"
  grep -q "backend cuda: cannot run this checkpoint: tensor 'mtp.0.main_proj.weight'" "$work/out" ||
    fail "table: $(cat "$work/out")"
  python3 -c "
import json, sys
b = json.load(open(sys.argv[1]))['backend']
assert b['runs'] is False and b['tensor'] == 'mtp.0.main_proj.weight' and b['format'] == 'fp8_block', b
assert b['tensors_not_run'] == 97, b" "$work/report.json" || fail "json backend"
else
  run 1 "$work/bf16" --tp 1 --backend cuda
  grep -q "this build has no CUDA backend" "$work/err" || fail "no-CUDA message: $(cat "$work/err")"
fi
echo "PASS: --backend cpu runs fp8; cuda (built: $have_cuda) as expected"
