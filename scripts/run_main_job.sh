#!/usr/bin/env bash
# The main job on the embedded default: the tiny synthetic checkpoint (SPEC §2) served by
# `mpirun -np 2 dspark_worker configs/tiny-cpu.yaml` on the CPU backend, driven over shared memory by
# `dspark_client bench` (a seeded simulated engine: context rows, drafts, verification, re-inserts) for a few
# hundred steps; prints drafts and latencies, then stops the worker with SIGTERM and checks it exited cleanly.
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

mpirun -np 2 "$build/apps/dspark_worker" "$root/configs/tiny-cpu.yaml" &
worker=$!
stop_worker() { pkill -TERM -P "$worker" 2>/dev/null || true; }
trap stop_worker EXIT

"$build/apps/dspark_client" --ring /dspark-tiny --timeout-ms 60000 info
"$build/apps/dspark_client" --ring /dspark-tiny bench --steps "$steps" --sequences 4 --print-drafts 2
"$build/apps/dspark_client" --ring /dspark-tiny stats

trap - EXIT
pkill -TERM -P "$worker"  # the ranks (mpirun itself would report the signal as a failure)
if wait "$worker"; then
  echo "worker stopped cleanly"
else
  rc=$?
  echo "worker exited with status $rc" >&2
  exit "$rc"
fi
