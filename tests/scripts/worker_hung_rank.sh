#!/usr/bin/env bash
# A rank that stops answering (SIGSTOP to rank 1 of mpirun -np 2, health.step_timeout_ms 1000): the next step
# blocks in a collective, rank 0's watchdog marks the worker unhealthy, so the waiting client fails with
# UNAVAILABLE (exit 3) about a second later instead of at its own 60 s limit, and the worker exits non-zero
# (status 2) for its supervisor, mpirun ending the stopped rank. Usage: worker_hung_rank.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
ring=/dspark-test-hung-$$
worker= stopped=
cleanup() {
  if [ -n "$stopped" ]; then kill -CONT "$stopped" 2>/dev/null || true; fi
  if [ -n "$worker" ]; then
    pkill -KILL -P "$worker" 2>/dev/null || true
    kill -KILL "$worker" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log "$work"/*.err; do
    [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }
  done
  exit 1
}
client=$build/apps/dspark_client
"$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" 2>/dev/null
sed "s|^checkpoint:.*|checkpoint: $work/ckpt|; s|^ring:|ring:\n  name: $ring|; s|^  step_timeout_ms:.*|  step_timeout_ms: 1000|" \
  "$src/configs/tiny-cpu.yaml" >"$work/worker.yaml"
grep -q "step_timeout_ms: 1000" "$work/worker.yaml" || fail "could not set health.step_timeout_ms"

mpirun -np 2 "$build/apps/dspark_worker" "$work/worker.yaml" >"$work/worker.log" 2>&1 &
worker=$!
"$client" --ring "$ring" --worker-pid "$worker" --timeout-ms 60000 health >/dev/null || fail "the worker did not serve"
"$client" --ring "$ring" --timeout-ms 60000 bench --steps 3 >"$work/bench-ok.log" 2>&1 || fail "a healthy bench failed"

# Rank 1: the dspark_worker child of mpirun whose environment says so.
for p in $(pgrep -P "$worker" -f dspark_worker || true); do
  if tr '\0' '\n' <"/proc/$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=1"; then stopped=$p; fi
done
[ -n "$stopped" ] || fail "rank 1's process not found among mpirun's children"
kill -STOP "$stopped"

t0=$(date +%s%N)
rc=0
"$client" --ring "$ring" --timeout-ms 60000 bench --steps 3 >"$work/bench-hung.log" 2>"$work/bench-hung.err" || rc=$?
took_ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" -eq 3 ] || fail "the client exited $rc, expected 3 (UNAVAILABLE)"
grep -q "unhealthy\|gone" "$work/bench-hung.err" || fail "the client's reason: $(cat "$work/bench-hung.err")"
[ "$took_ms" -lt 10000 ] || fail "the client took $took_ms ms to see UNAVAILABLE"
echo "ok: the client saw UNAVAILABLE after $took_ms ms: $(cat "$work/bench-hung.err")"

waited=0
while kill -0 "$worker" 2>/dev/null && [ "$waited" -lt 300 ]; do
  sleep 0.1
  waited=$((waited + 1))
done
kill -0 "$worker" 2>/dev/null && fail "mpirun still runs 30 s after the step timed out"
wrc=0
wait "$worker" || wrc=$?
worker= stopped=
[ "$wrc" -ne 0 ] || fail "mpirun exited 0 after a hung rank"
grep -q "past health.step_timeout_ms (1000 ms)" "$work/worker.log" || fail "the worker did not log the timeout"
echo "ok: the worker exited (mpirun $wrc) and logged: $(grep -m1 'past health.step_timeout_ms' "$work/worker.log")"
