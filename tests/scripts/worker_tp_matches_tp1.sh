#!/usr/bin/env bash
# mpirun -np 2 dspark_worker serves the same drafts as the one-rank run of the same requests (the built-in
# driver's inputs depend on its seed only), by scripts/compare_drafts.py's rule; both runs shut down cleanly.
# Usage: worker_tp_matches_tp1.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" >/dev/null
sed "s|^checkpoint:.*|checkpoint: $work/ckpt|; s|^  name: .*|  name: /dspark-test-$$|" "$src/configs/tiny-cpu.yaml" \
  >"$work/worker.yaml"
for n in 1 2; do
  mpirun -np $n "$build/apps/dspark_worker" "$work/worker.yaml" --local-driver 30 --seed 5 \
    --drafts-out "$work/drafts-tp$n.jsonl"
done
python3 "$src/scripts/compare_drafts.py" "$work/drafts-tp1.jsonl" "$work/drafts-tp2.jsonl"
