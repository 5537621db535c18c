#!/usr/bin/env bash
# mpirun -np 2 dspark_worker (and dspark_draft) serve the same drafts as the one-rank run of the same requests (the built-in
# driver's inputs depend on its seed only), by scripts/compare_drafts.py's rule; both runs shut down cleanly.
# Usage: worker_tp_matches_tp1.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" >/dev/null
sed "s|^checkpoint:.*|checkpoint: $work/ckpt|" "$src/configs/tiny-cpu.yaml" \
  >"$work/worker.yaml"
for n in 1 2; do
  mpirun -np $n "$build/apps/dspark_worker" "$work/worker.yaml" --local-driver 30 --seed 5 \
    --drafts-out "$work/drafts-tp$n.jsonl"
done
python3 "$src/scripts/compare_drafts.py" "$work/drafts-tp1.jsonl" "$work/drafts-tp2.jsonl"
# dspark_draft the same way: N shards print the one-rank JSON within the rule.
for n in 1 2; do
  mpirun -np $n "$build/apps/dspark_draft" "$work/ckpt" --random-rows 0:30 --random-rows 1:12 --random-rows 2:5 \
    --random-rows 3:19 --seed 9 --json "$work/draft-tp$n.json" >/dev/null
done
python3 "$src/scripts/compare_drafts.py" "$work/draft-tp1.json" "$work/draft-tp2.json" --max-diverged 0.25
