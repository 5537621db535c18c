#!/usr/bin/env bash
# How a worker under mpirun stops, and the exit status each way gives (the README's "Stopping a worker"):
#   dspark_client stop (SIGTERM to rank 0)  -> mpirun exits 0
#   kill -USR1 <mpirun> (forwarded to every rank) -> 0
#   kill -TERM <mpirun>                     -> 1: mpirun kills the ranks itself (they still stop cleanly)
# and a worker that dies while starting makes `dspark_client --worker-pid` fail at once, not after the timeout.
# Usage: worker_stop.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
ring=/dspark-test-stop-$$
worker=
cleanup() {
  if [ -n "$worker" ]; then pkill -KILL -P "$worker" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
client=$build/apps/dspark_client
"$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" 2>/dev/null
sed "s|^checkpoint:.*|checkpoint: $work/ckpt|; s|^ring:|ring:\n  name: $ring|" "$src/configs/tiny-cpu.yaml" \
  >"$work/worker.yaml"

fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log; do
    [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }
  done
  exit 1
}

# start NAME: mpirun -np 2 in the background ($worker), returning once it serves.
start() {
  mpirun -np 2 "$build/apps/dspark_worker" "$work/worker.yaml" >"$work/$1.log" 2>&1 &
  worker=$!
  "$client" --ring "$ring" --worker-pid "$worker" --timeout-ms 60000 health >/dev/null ||
    fail "$1: the worker did not serve"
}

# finish NAME WANT: waits for mpirun, checks its exit status and that both ranks logged a clean shutdown.
finish() {
  local rc=0
  wait "$worker" || rc=$?
  worker=
  [ "$rc" -eq "$2" ] || fail "$1: mpirun exited $rc, expected $2"
  [ "$(grep -c 'worker stopped (clean shutdown)' "$work/$1.log")" -eq 2 ] ||
    fail "$1: not every rank logged a clean shutdown"
  echo "ok: $1: mpirun exited $rc, both ranks stopped cleanly"
}

start client-stop
out=$("$client" --ring "$ring" stop) || fail "dspark_client stop exited $?"
[[ "$out" == "stopped the worker of $ring (rank 0, pid "* ]] || fail "dspark_client stop said: $out"
finish client-stop 0

start usr1
kill -USR1 "$worker"
finish usr1 0

start term
kill -TERM "$worker"
finish term 1

# Nothing serves the ring any more: stop says so (3).
rc=0
"$client" --ring "$ring" stop 2>"$work/stop-none.err" || rc=$?
[ "$rc" -eq 3 ] && grep -q "no worker to stop" "$work/stop-none.err" ||
  fail "stop without a worker exited $rc: $(cat "$work/stop-none.err")"
echo "ok: stop without a worker: exit 3"

# A worker that cannot start (no checkpoint): the client reports it within seconds, not after 60 s.
sed "s|^checkpoint:.*|checkpoint: $work/no-such-ckpt|" "$work/worker.yaml" >"$work/broken.yaml"
mpirun -np 2 "$build/apps/dspark_worker" "$work/broken.yaml" >"$work/broken.log" 2>&1 &
worker=$!
t0=$(date +%s)
rc=0
"$client" --ring "$ring" --worker-pid "$worker" --timeout-ms 60000 info 2>"$work/broken.err" || rc=$?
took=$(($(date +%s) - t0))
wait "$worker" || true
worker=
[ "$rc" -eq 3 ] && grep -q "the worker (pid [0-9]*) exited before $ring served" "$work/broken.err" ||
  fail "a worker that died while starting: client exited $rc: $(cat "$work/broken.err")"
[ "$took" -lt 20 ] || fail "the client took $took s to notice the dead worker"
echo "ok: a worker that died while starting: the client exited 3 after $took s"
