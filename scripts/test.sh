#!/usr/bin/env bash
# Builds if needed and runs the whole test suite with ctest (GPU tests skip without a GPU).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DSPARK_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
# MPI tests run oversubscribed; as root Open MPI needs the explicit consent flags.
export OMPI_MCA_rmaps_base_oversubscribe=1
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
