#!/usr/bin/env bash
# dspark_bench --iteration on the CPU backend at tp 1 and tp 2: for bf16 and fp8 and B = 1, 2, the step, the
# insert + draft and the step through the host ring (which the bench itself fails unless its drafts equal
# the step's bit for bit). Each ring row carries its step's bytes and floor and positive times, comes after
# the other rows, and the bench's ring socket is gone once it exits.
# Usage: bench_iteration_cpu.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export XDG_RUNTIME_DIR=$work/run  # the ring's socket directory: $XDG_RUNTIME_DIR/dspark
mkdir -m 700 "$work/run"
for np in 1 2; do
  mpirun -np $np "$build/apps/dspark_bench" --backend cpu --format bf16,fp8 --batch 1,2 --insert-rows 1 \
    --iteration --iters 5 --warmup 1 --json "$work/tp$np.json" > "$work/out$np" 2>&1 ||
    { echo "FAIL: dspark_bench at tp $np:"; tail -20 "$work/out$np"; exit 1; }
done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
for np in (1, 2):
    runs = json.load(open(f"{work}/tp{np}.json"))["runs"]
    assert [r["format"] for r in runs] == ["bf16", "fp8"], [r["format"] for r in runs]
    for r in runs:
        ms = r["measurements"]
        assert r["tp"] == np, r["tp"]
        kinds = [m["kind"] for m in ms]
        assert kinds[-2:] == ["step_ring", "step_ring"], kinds
        for b in (1, 2):
            got = {m["kind"]: m for m in ms if m.get("batch") == b}
            assert {"draft", "step", "step2", "step_ring"} <= set(got), (np, r["format"], b, set(got))
            ring, step = got["step_ring"], got["step"]
            assert ring["weight_bytes"] == step["weight_bytes"] > 0, (ring, step)
            assert ring["floor_us"] == step["floor_us"] > 0, (ring, step)
            assert ring["distinct_experts_per_stage"] == step["distinct_experts_per_stage"], (ring, step)
            assert 0 < ring["median_us"] <= ring["p99_us"], ring
    table = open(f"{work}/out{np}").read()
    for f in ("bf16", "fp8"):
        for b in (1, 2):
            assert f"{f} tp{np} B={b} step ring " in table, (f, b, table)
PY
left=$(find "$work/run" -name '*.sock' | wc -l)
[ "$left" = 0 ] || { echo "FAIL: the bench left $left socket(s) behind"; exit 1; }
echo "PASS: the steps through the ring answered the step's drafts at tp 1 and 2, with the step's floor"
