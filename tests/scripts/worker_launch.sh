#!/usr/bin/env bash
# scripts/dspark-launch on the tiny CPU worker (docs/operations.md):
#   bad options, a missing config and a config the worker refuses: exit 64 at once, naming the reason;
#   2 ranks: the ready file once both serve, a bench through it, SIGTERM to the launcher -> exit 0, both
#   ranks logging a clean shutdown and their loading progress into one file each, the ready file removed;
#   SIGINT to the launcher's process group (Ctrl-C) -> exit 0 the same way;
#   an mpirun that never serves and ignores SIGTERM: --ready-timeout, then SIGTERM, then SIGKILL -> exit 1;
#   a worker that fails to start (a checkpoint directory without config.json): the launcher exits 1.
# Usage: worker_launch.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
ring=/dspark-test-launch-$$
launch=$src/scripts/dspark-launch
client=$build/apps/dspark_client
launcher=''

# kill_tree PID: PID and every process below it, SIGKILL.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
  kill -KILL "$1" 2>/dev/null || true
}
cleanup() {
  if [ -n "$launcher" ]; then kill_tree "$launcher"; fi
  [ -n "${KEEP_WORK:-}" ] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.err "$work"/*.out "$work"/logs/*.log; do
    [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }
  done
  exit 1
}

"$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" 2>/dev/null
sed "s|^checkpoint:.*|checkpoint: $work/ckpt|; s|^ring:|ring:\n  name: $ring|" "$src/configs/tiny-cpu.yaml" \
  >"$work/worker.yaml"
grep -q "name: $ring" "$work/worker.yaml" || fail "could not name the ring in the config"

# refused WHAT WANT ARGS...: the launcher exits 64 within 10 s and its stderr holds WANT.
refused() {
  local what=$1 want=$2 rc=0 t0=$SECONDS
  shift 2
  "$launch" --build "$build" "$@" >"$work/refused.out" 2>"$work/refused.err" || rc=$?
  [ "$rc" -eq 64 ] || fail "$what: the launcher exited $rc, expected 64"
  grep -q -- "$want" "$work/refused.err" || fail "$what: the reason does not say '$want'"
  [ $((SECONDS - t0)) -lt 10 ] || fail "$what: took $((SECONDS - t0)) s"
  echo "ok: $what: exit 64: $(head -1 "$work/refused.err")"
}
refused "unknown option" "unknown option '--bogus'" --bogus "$work/worker.yaml"
refused "no config" "no config given"
refused "missing config" "config '$work/none.yaml': no such readable file" "$work/none.yaml"
refused "bad --np" "--np must be a positive integer (got 'two')" --np two "$work/worker.yaml"
refused "bad --gpus" "--gpus must be comma-separated GPU indices" --gpus 0,x "$work/worker.yaml"
printf 'bogus_key: 1\n' | cat "$work/worker.yaml" - >"$work/bad-key.yaml"
refused "unknown config key" "config refused: .*bogus_key" "$work/bad-key.yaml"
sed "s|^checkpoint:.*|checkpoint: $work/no-such-ckpt|" "$work/worker.yaml" >"$work/no-ckpt.yaml"
refused "missing checkpoint" "checkpoint $work/no-such-ckpt is not a directory" "$work/no-ckpt.yaml"
refused "missing binaries" "dspark_worker not found in $work/apps" --build "$work" "$work/worker.yaml"

# ended PID SECONDS: whether PID ends within SECONDS.
ended() {
  local waited=0
  while kill -0 "$1" 2>/dev/null && [ "$waited" -lt $(($2 * 10)) ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  ! kill -0 "$1" 2>/dev/null
}

# Serve, draft, stop with SIGTERM.
"$launch" --build "$build" --np 2 --oversubscribe --log-dir "$work/logs" --ready-file "$work/run/ready" \
  "$work/worker.yaml" >"$work/launch.out" 2>"$work/launch.err" &
launcher=$!
waited=0
while [ ! -f "$work/run/ready" ] && kill -0 "$launcher" 2>/dev/null && [ "$waited" -lt 600 ]; do
  sleep 0.1
  waited=$((waited + 1))
done
[ -f "$work/run/ready" ] || fail "no ready file after $((waited / 10)) s"
socket=$(awk '$1 == "socket" {print $2}' "$work/run/ready")
mpirun_pid=$(awk '$1 == "mpirun_pid" {print $2}' "$work/run/ready")
grep -qx "ranks 2" "$work/run/ready" || fail "the ready file does not say 2 ranks: $(cat "$work/run/ready")"
grep -qx "pid $launcher" "$work/run/ready" || fail "the ready file does not name the launcher's pid"
[[ "$socket" == */${ring#/}.sock ]] || fail "the ready file's socket $socket is not the config's ring $ring"
kill -0 "$mpirun_pid" 2>/dev/null || fail "the ready file's mpirun pid $mpirun_pid does not run"
grep -q "dspark-launch: ready: $socket serves with 2 rank(s)" "$work/launch.err" || fail "no ready line"
health=$("$client" --ring "$ring" --timeout-ms 1000 health) || fail "health exited $? after ready"
grep -qx "state serving" <<<"$health" && grep -qx "tp 2" <<<"$health" || fail "health after ready: $health"
echo "ok: ready after about $((waited / 10)) s: $(tr '\n' ' ' <"$work/run/ready")"

"$client" --ring "$ring" --timeout-ms 60000 bench --steps 3 --print-drafts 1 >"$work/bench.out" 2>&1 ||
  fail "bench through the launcher's worker exited $?"
grep -q "p50" "$work/bench.out" || fail "bench printed no latencies"
echo "ok: bench --steps 3: $(grep -m1 p50 "$work/bench.out")"

kill -TERM "$launcher"
ended "$launcher" 60 || fail "the launcher still runs 60 s after SIGTERM"
rc=0
wait "$launcher" || rc=$?
launcher=''
[ "$rc" -eq 0 ] || fail "the launcher exited $rc after SIGTERM, expected 0"
grep -q "SIGTERM: stopping the worker" "$work/launch.err" || fail "the launcher did not say it stops the worker"
grep -q "every rank shut down cleanly" "$work/launch.err" || fail "the launcher did not report the clean stop"
[ ! -e "$work/run/ready" ] || fail "the ready file outlived the launcher"
kill -0 "$mpirun_pid" 2>/dev/null && fail "mpirun (pid $mpirun_pid) outlived the launcher"
for r in 0 1; do
  log=$work/logs/dspark-worker-rank$r.log
  [ -f "$log" ] || fail "no log file $log"
  grep -q "\[rank $r/2\].*worker stopped (clean shutdown)" "$log" || fail "rank $r logged no clean shutdown"
  grep -q "\[rank $r/2\].*loading weights: [0-9.]* [kMG]*B for this rank" "$log" || fail "rank $r: no load start"
  grep -q "\[rank $r/2\].*loaded weights: [0-9.]* [kMG]*B in [0-9.]* s ([0-9.]* [kMG]*B/s)" "$log" ||
    fail "rank $r: no final loading line"
  echo "ok: rank $r: $(grep -m1 -o 'loaded weights: .*' "$log"); $(grep -c . "$log") lines in $(basename "$log")"
done
grep -q "\[rank 1/2\]" "$work/logs/dspark-worker-rank0.log" && fail "rank 1's lines in rank 0's file"
echo "ok: SIGTERM: the launcher exited 0, both ranks stopped cleanly"

# Ctrl-C in a terminal: SIGINT to the launcher's whole process group (job control gives it its own) reaches
# only the launcher, mpirun having its own session, so the stop is the clean one and the launcher exits 0.
set -m
"$launch" --build "$build" --np 2 --oversubscribe --ready-file "$work/run/ready" "$work/worker.yaml" \
  >"$work/sigint.out" 2>"$work/sigint.err" &
launcher=$!
set +m
waited=0
while [ ! -f "$work/run/ready" ] && kill -0 "$launcher" 2>/dev/null && [ "$waited" -lt 600 ]; do
  sleep 0.1
  waited=$((waited + 1))
done
[ -f "$work/run/ready" ] || fail "SIGINT case: no ready file after $((waited / 10)) s"
kill -INT -- "-$launcher"
ended "$launcher" 60 || fail "the launcher still runs 60 s after SIGINT to its process group"
rc=0
wait "$launcher" || rc=$?
launcher=''
[ "$rc" -eq 0 ] || fail "the launcher exited $rc after SIGINT, expected 0"
[ "$(grep -c 'worker stopped (clean shutdown)' "$work/sigint.err")" -eq 2 ] ||
  fail "SIGINT: not every rank logged a clean shutdown"
echo "ok: SIGINT to the launcher's process group: exit 0, both ranks stopped cleanly"

# A worker that never serves (an mpirun that only sleeps, deaf to SIGTERM): past --ready-timeout the launcher
# tries the clean stop for --stop-timeout, then SIGTERM, then 10 s later SIGKILL to mpirun's process group; 1.
printf '#!/usr/bin/env bash\ntrap "" TERM\nsleep 300 &\nwait\n' >"$work/deaf-mpirun"
chmod +x "$work/deaf-mpirun"
rc=0 t0=$SECONDS
"$launch" --build "$build" --mpirun "$work/deaf-mpirun" --np 2 --ready-timeout 2 --stop-timeout 2 \
  "$work/worker.yaml" >"$work/deaf.out" 2>"$work/deaf.err" || rc=$?
took=$((SECONDS - t0))
[ "$rc" -eq 1 ] || fail "a worker that never served: the launcher exited $rc, expected 1"
grep -q "not serving after 2 s (--ready-timeout)" "$work/deaf.err" || fail "no ready-timeout line"
grep -q "did not stop within 2 s: SIGTERM to mpirun" "$work/deaf.err" || fail "no SIGTERM escalation"
grep -q "still runs: SIGKILL to its process group" "$work/deaf.err" || fail "no SIGKILL escalation"
[ "$took" -ge 12 ] && [ "$took" -lt 30 ] || fail "the escalation took $took s, expected about 14"
echo "ok: never serving: --ready-timeout, SIGTERM then SIGKILL to mpirun after $took s, exit 1"

# A worker that passes the config check but fails to load: the launcher exits with mpirun's 1, never ready.
mkdir "$work/empty-ckpt"
sed "s|^checkpoint:.*|checkpoint: $work/empty-ckpt|" "$work/worker.yaml" >"$work/empty.yaml"
rc=0
"$launch" --build "$build" --np 2 --oversubscribe --ready-file "$work/run/ready" "$work/empty.yaml" \
  >"$work/empty.out" 2>"$work/empty.err" || rc=$?
[ "$rc" -eq 1 ] || fail "a worker that failed to start: the launcher exited $rc, expected 1"
grep -q "mpirun exited 1: the worker failed to start" "$work/empty.err" || fail "no failed-start line"
grep -q "dspark-launch: ready" "$work/empty.err" && fail "a failed worker was reported ready"
[ ! -e "$work/run/ready" ] || fail "a failed worker left a ready file"
echo "ok: a worker that failed to start: the launcher exited 1"
