#!/usr/bin/env bash
# The main job on the embedded default: the tiny synthetic checkpoint (SPEC §2) served by
# `mpirun -np 2 dspark_worker configs/tiny-cpu.yaml` on the CPU backend, driven through its host interface by
# `dspark_client bench` (a seeded simulated engine: context rows, drafts, verification, re-inserts) for a few
# hundred steps; prints drafts and latencies, then stops the worker with `dspark_client stop` (SIGTERM to rank 0)
# and checks that mpirun exited 0.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DSPARK_BUILD_DIR:-$root/build}
steps=${DSPARK_BENCH_STEPS:-300}
ckpt=$root/out/tiny-ckpt
if [ ! -f "$ckpt/config.json" ]; then
  "$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$ckpt" --force
fi
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_rmaps_base_oversubscribe=1
client=$build/apps/dspark_client  # attaches to the config's ring: the default /dspark-<uid>

mpirun -np 2 "$build/apps/dspark_worker" "$root/configs/tiny-cpu.yaml" &
worker=$!
kill_worker() { pkill -TERM -P "$worker" 2>/dev/null || true; }
trap kill_worker EXIT

"$client" --worker-pid "$worker" --timeout-ms 60000 info
"$client" bench --steps "$steps" --sequences 4 --print-drafts 2
"$client" stats

"$client" stop  # SIGTERM to mpirun itself would make it exit 1 however cleanly the ranks stop
trap - EXIT
if wait "$worker"; then
  echo "worker stopped cleanly"
else
  rc=$?
  echo "worker exited with status $rc" >&2
  exit "$rc"
fi
