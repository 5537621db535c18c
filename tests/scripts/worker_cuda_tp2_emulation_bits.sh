#!/usr/bin/env bash
# The worker at tp = 2 on two GPUs (device_map: [0, 1]: NCCL, the exchanges in peer memory) and on one GPU
# (device_map: [0, 0]: SPEC §5's emulation, IpcCommunicator, through shared_gpu.sh) serves the same requests
# (the built-in driver's inputs depend on its seed only) with the same drafts, bit for bit: ids, confidences
# and margins. Exits 77 (skipped) with fewer than two GPUs. Registered with CUDA + NCCL builds only.
# Usage: worker_cuda_tp2_emulation_bits.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
if [ "$gpus" -lt 2 ]; then
  echo "needs two GPUs, this host has $gpus"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" >/dev/null
for map in "0, 1" "0, 0"; do
  name=$(tr -d ', ' <<<"$map")
  sed -e "s|^checkpoint:.*|checkpoint: $work/ckpt|" -e "s|^device_map:.*|device_map: [$map]|" \
    "$src/configs/tiny-cuda.yaml" >"$work/worker-$name.yaml"
  grep -q "^device_map: \[$map\]" "$work/worker-$name.yaml" ||
    { echo "FAIL: configs/tiny-cuda.yaml has no device_map line to set"; exit 1; }
  bash "$src/tests/scripts/shared_gpu.sh" mpirun -np 2 "$build/apps/dspark_worker" "$work/worker-$name.yaml" \
    --local-driver 30 --seed 5 --drafts-out "$work/drafts-$name.jsonl"
done
python3 - "$work/drafts-01.jsonl" "$work/drafts-00.jsonl" <<'PY'
import json, sys
two, one = ([json.loads(line) for line in open(p)] for p in sys.argv[1:])
assert len(two) == len(one) > 0, (len(two), len(one))
for step, (a, b) in enumerate(zip(two, one)):
    assert len(a["requests"]) == len(b["requests"]), step
    for r, (x, y) in enumerate(zip(a["requests"], b["requests"])):
        for key in ("slot", "token", "pos", "ids", "conf", "margin"):
            if x[key] != y[key]:
                sys.exit(f"FAIL: step {step} request {r}: {key} {x[key]} on two GPUs, {y[key]} on one")
print(f"PASS: {len(two)} steps, the same drafts bit for bit on two GPUs and on one")
PY
