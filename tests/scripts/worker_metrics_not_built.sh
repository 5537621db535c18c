#!/usr/bin/env bash
# A build without prometheus-cpp and a config that sets metrics.port: `--check-config` refuses it (exit 1) and
# a worker fails at start (exit 1), both naming the missing build feature; metrics.port: 0 checks out.
# Usage: worker_metrics_not_built.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.out; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}
"$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" 2>/dev/null
sed "s|^checkpoint:.*|checkpoint: $work/ckpt|; s|^ring:|ring:\n  name: /dspark-test-nometrics-$$|" \
  "$src/configs/tiny-cpu.yaml" >"$work/off.yaml"
printf 'metrics:\n  port: 9400\n' | cat "$work/off.yaml" - >"$work/on.yaml"
want="metrics.port: 9400: this build has no Prometheus metrics (built without prometheus-cpp and libmicrohttpd"

"$build/apps/dspark_worker" "$work/off.yaml" --check-config >"$work/off.out" 2>&1 || fail "metrics off: refused"
grep -qx "metrics off" "$work/off.out" || fail "metrics off: --check-config does not say 'metrics off'"
rc=0
"$build/apps/dspark_worker" "$work/on.yaml" --check-config >"$work/check.out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "--check-config exited $rc, expected 1"
grep -qF "$want" "$work/check.out" || fail "--check-config does not name the missing build feature"
echo "ok: --check-config: exit 1: $(cat "$work/check.out")"
rc=0
timeout 120 mpirun -np 1 "$build/apps/dspark_worker" "$work/on.yaml" >"$work/start.out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "the worker exited $rc, expected 1"
grep -qF "$want" "$work/start.out" || fail "the worker's start does not name the missing build feature"
echo "ok: worker start: exit 1: $(grep -F "$want" "$work/start.out")"
