#!/usr/bin/env bash
# scripts/bench_ab.py on the CPU backend: this build as two variants (a: --iters 3, b: --iters 4), two rounds,
# bf16 and fp8 at B = 1 and an insert of 1 row. The runs come in the A B B A order, each with its variant's
# arguments; the summary's medians are the runs' own, in run order, and its ratios and the printed table's
# agree with a median worked out here.
# Usage: bench_ab_cpu.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$src/scripts/bench_ab.py" a="$build" b="$build" --args "a=--iters 3" --args "b=--iters 4" \
  --json "$work/ab.json" -- --backend cpu --format bf16,fp8 --batch 1 --insert-rows 1 --warmup 1 \
  > "$work/out" 2> "$work/err" || { echo "FAIL: bench_ab.py: $(cat "$work/err")"; exit 1; }
python3 - "$work/ab.json" "$work/out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
table = open(sys.argv[2]).read().splitlines()
runs = d["runs"]
assert [(r["round"], r["variant"]) for r in runs] == [(0, "a"), (0, "b"), (1, "b"), (1, "a")], runs
for r in runs:
    assert r["info"]["iters"] == {"a": 3, "b": 4}[r["variant"]], r["info"]
    assert {(m["format"], m["kind"]) for m in r["measurements"]} == {
        ("bf16", "draft"), ("bf16", "insert"), ("fp8", "draft"), ("fp8", "insert")}, r["measurements"]

def mid(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

assert len(d["summary"]) == 4, d["summary"]
for s in d["summary"]:
    own = {name: [m["median_us"] for r in runs if r["variant"] == name for m in r["measurements"]
                  if (m["format"], m["kind"], m.get("batch", m.get("rows"))) == (s["format"], s["kind"], s["size"])]
           for name in ("a", "b")}
    assert s["medians_us"] == own, (s, own)
    assert all(x > 0 for v in own.values() for x in v), own
    ratio = mid(own["b"]) / mid(own["a"])
    assert abs(s["ratio_to_first"]["b"] - ratio) < 1e-9, (s, ratio)
    label = f"{s['format']} {s['kind']} {'rows' if s['kind'] == 'insert' else 'B'}={s['size']}"
    line = [l for l in table if l.startswith(label + " ")]
    assert len(line) == 1 and line[0].split()[-1] == f"{ratio:.3f}", (label, table)
PY
echo "PASS: bench_ab.py ran both variants in the A B B A order with their own arguments"
