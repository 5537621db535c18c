#!/usr/bin/env bash
# The worker at tp = 2 on one GPU (device_map: [0, 0], SPEC §5's emulation, through shared_gpu.sh)
# serves the drafts of the one-rank CUDA run of the same requests (the built-in driver's inputs depend on its
# seed only), by scripts/compare_drafts.py's rule; both runs shut down cleanly. Exits 77 (skipped) without a
# GPU. Registered with CUDA builds only. Usage: worker_cuda_tp2_one_gpu.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU on this host"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" >/dev/null
for n in 1 2; do
  sed -e "s|^checkpoint:.*|checkpoint: $work/ckpt|" -e "s|^device_map:.*|device_map: [$( [ $n = 2 ] && echo 0, 0 || echo 0)]|" \
    "$src/configs/tiny-cuda.yaml" >"$work/worker-tp$n.yaml"
  bash "$src/tests/scripts/shared_gpu.sh" mpirun -np $n "$build/apps/dspark_worker" "$work/worker-tp$n.yaml" \
    --local-driver 30 --seed 5 --drafts-out "$work/drafts-tp$n.jsonl"
done
python3 "$src/scripts/compare_drafts.py" "$work/drafts-tp1.jsonl" "$work/drafts-tp2.jsonl"
