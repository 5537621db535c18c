#!/usr/bin/env bash
# Configures (once) and builds dspark into build/ (or $DSPARK_BUILD_DIR). CUDA targets are built when nvcc is
# found, on PATH or in /usr/local/cuda. Extra arguments go to the first configure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DSPARK_BUILD_DIR:-$root/build}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  # Optimised as Release (-O3: the CPU backend's inner loops run a quarter faster than at RelWithDebInfo's
  # -O2), with debug symbols for crash reports.
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O3 -g -DNDEBUG" -DDSPARK_WERROR=ON "$@"
fi
cmake --build "$build" -j "$(nproc)"
