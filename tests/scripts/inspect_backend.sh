#!/usr/bin/env bash
# dspark_inspect --backend: the cpu backend runs the tiny fp8 checkpoint and a copy with one EXL3 weight (exit
# 0); the cuda backend, in a build that has it, answers as CudaBackend::runs_format says (dense, fp8 block,
# fp4 and EXL3: all three checkpoints run); a build without it says so.
# Usage: inspect_backend.sh BUILD_DIR HAVE_CUDA(0|1)
set -euo pipefail
build=$1 have_cuda=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
inspect=$build/apps/dspark_inspect
"$build/apps/dspark_make_ckpt" --preset tiny --out "$work/bf16" 2>/dev/null
"$build/apps/dspark_make_ckpt" --preset tiny --format fp8 --out "$work/fp8" 2>/dev/null
# The bf16 copy with mtp.0.attn.wq_a ([128, 256]) as EXL3 parts: trellis I16 [256/16, 128/16, 16 * 2] (K = 2),
# suh F16 [256], svh F16 [128] (zero bytes: only the headers are read).
python3 - "$work" <<'PY'
import json, os, struct, sys
work = sys.argv[1]
src, dst = f"{work}/bf16/model.safetensors", f"{work}/exl3"
os.makedirs(dst)
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
parts, out = [], {}
for name, t in header.items():
    if name == "__metadata__":
        continue
    if name == "mtp.0.attn.wq_a.weight":
        parts += [("mtp.0.attn.wq_a.trellis", "I16", [16, 8, 32], 2), ("mtp.0.attn.wq_a.suh", "F16", [256], 2),
                  ("mtp.0.attn.wq_a.svh", "F16", [128], 2)]
        continue
    parts.append((name, t["dtype"], t["shape"], data[t["data_offsets"][0]:t["data_offsets"][1]]))
blob = b""
for name, dtype, shape, payload in parts:
    if isinstance(payload, int):
        count = 1
        for d in shape:
            count *= d
        payload = bytes(count * payload)
    out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(payload)]}
    blob += payload
text = json.dumps(out).encode()
text += b" " * (-len(text) % 8)
with open(f"{dst}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + blob)
with open(f"{work}/bf16/config.json") as f, open(f"{dst}/config.json", "w") as g:
    g.write(f.read())
PY

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
run 0 "$work/exl3" --tp 2
grep -q "backend cpu: runs every tensor as stored (dense, EXL3)" "$work/out" || fail "cpu on EXL3: $(cat "$work/out")"

if [ "$have_cuda" = 1 ]; then
  run 0 "$work/bf16" --tp 2 --backend cuda
  grep -q "backend cuda: runs every tensor as stored (dense)" "$work/out" || fail "cuda on bf16: $(cat "$work/out")"
  run 0 "$work/fp8" --tp 2 --backend cuda
  grep -q "backend cuda: runs every tensor as stored (dense, fp8 block, fp4)" "$work/out" ||
    fail "cuda on fp8: $(cat "$work/out")"
  run 0 "$work/exl3" --tp 2 --backend cuda
  grep -q "backend cuda: runs every tensor as stored (dense, EXL3)" "$work/out" ||
    fail "cuda on EXL3: $(cat "$work/out")"
else
  run 1 "$work/bf16" --tp 1 --backend cuda
  grep -q "this build has no CUDA backend" "$work/err" || fail "no-CUDA message: $(cat "$work/err")"
fi
echo "PASS: --backend cpu runs fp8 and EXL3; cuda (built: $have_cuda) as expected"
