#!/usr/bin/env bash
# scripts/ring_bench.py on the CPU backend: the tiny checkpoint served by two "builds" (this build under two
# names, so the rounds' order shows), batch sizes 1 and 2, two rounds: a row per (round, build, batch) in the
# A B B A order, each with its round trip's and the worker's step's p50 <= p99, all positive.
# Usage: ring_bench_cpu.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/apps/dspark_make_ckpt" --preset tiny --out "$work/ckpt" 2>/dev/null
ln -s "$(cd "$build" && pwd)" "$work/a"
ln -s "$(cd "$build" && pwd)" "$work/b"
python3 "$src/scripts/ring_bench.py" --build "$work/a" --build "$work/b" --checkpoint "$work/ckpt" --backend cpu \
  --batches 1,2 --steps 20 --warmup 5 --prefill 16 --json "$work/rows.json" > "$work/out" 2> "$work/err" ||
  { echo "FAIL: ring_bench.py: $(cat "$work/err")"; exit 1; }
python3 - "$work/rows.json" "$work/a" "$work/b" <<'PY'
import json, sys
rows, a, b = json.load(open(sys.argv[1]))["rows"], sys.argv[2], sys.argv[3]
order = [(r["round"], r["build"], r["batch"]) for r in rows]
want = [(0, a, 1), (0, a, 2), (0, b, 1), (0, b, 2), (1, b, 1), (1, b, 2), (1, a, 1), (1, a, 2)]
assert order == want, order
for r in rows:
    assert r["steps"] == 20, r
    assert 0 < r["ring_p50_us"] <= r["ring_p99_us"], r
    assert 0 < r["worker_p50_us"] <= r["worker_p99_us"], r
PY
grep -q "ring/worker" "$work/out" || { echo "FAIL: no table: $(cat "$work/out")"; exit 1; }
echo "PASS: ring_bench.py ran both builds in the A B B A order"
