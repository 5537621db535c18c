#!/usr/bin/env bash
# The GPU machine's check: builds dspark into build-gpu (Release, warnings as errors, Ninja, CUDA arch 90a),
# runs the GPU tests (CudaOps, CudaDrafter, CudaGolden, CudaDevice, test_cuda_tp at 1, 2, 4 and 8 ranks), then the
# whole suite, and prints a summary. Exit status 0 only when nothing failed and, where GPUs are visible, no GPU
# test skipped that should have run. Usage: scripts/gpu_check.sh [extra cmake -D options...]
# Environment: DSPARK_GPU_BUILD_DIR (default build-gpu), DSPARK_CUDA_ARCH (default 90a), NCCL_ROOT.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DSPARK_GPU_BUILD_DIR:-$root/build-gpu}
arch=${DSPARK_CUDA_ARCH:-90a}
gpu_regex='^(Cuda|test_cuda_tp_np)'

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
# mpirun as root needs Open MPI's explicit consent; NVLink SHARP stays off (identical-bits all-reduce, and the
# machines are not to use NVLink multicast). More ranks than cores is fine for the CPU-backend MPI tests.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
echo "== GPUs visible: $gpus"
[ "$gpus" -gt 0 ] && nvidia-smi -L

generator=Ninja
if ! command -v ninja >/dev/null 2>&1; then
  echo "warning: ninja not found (apt-get install ninja-build): using Unix Makefiles"
  generator="Unix Makefiles"
fi
echo "== configure + build: $build"
cmake -S "$root" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DDSPARK_WERROR=ON -DDSPARK_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" "$@" || { echo "RESULT: FAIL (configure)"; exit 1; }
cmake --build "$build" -j "$(nproc)" || { echo "RESULT: FAIL (build)"; exit 1; }
if [ ! -x "$build/tests/test_cuda_tp" ]; then
  echo "RESULT: FAIL (test_cuda_tp was not built: NCCL not found? set NCCL_ROOT)"
  exit 1
fi

cd "$build" || exit 1
logs=$build/gpu-check
mkdir -p "$logs"
echo "== GPU tests (ctest -R '$gpu_regex')"
ctest -R "$gpu_regex" --output-on-failure --timeout 600 -j 4 2>&1 | tee "$logs/gpu.log"
gpu_rc=${PIPESTATUS[0]}
echo "== the rest of the suite"
ctest -E "$gpu_regex" --output-on-failure --timeout 600 -j "$(nproc)" 2>&1 | tee "$logs/rest.log"
rest_rc=${PIPESTATUS[0]}

# ctest lists skipped tests as "<n> - <name> (Skipped)" under "The following tests did not run".
skipped=$(grep -E '^\s*[0-9]+ - .* \(Skipped\)' "$logs/gpu.log" | sed -E 's/^\s*[0-9]+ - ([^ ]+).*/\1/')
# With GPUs, only the golden case may skip (when shared/ is elsewhere), and below two GPUs the comparison of
# two GPUs with the emulation: the tp tests run on one GPU too.
unexpected=""
if [ "$gpus" -gt 0 ]; then
  for t in $skipped; do
    case "$t" in
      CudaGolden.*) echo "note: $t skipped (no golden case: pass -DDSPARK_SHARED_DIR=/path/to/shared)" ;;
      test_cuda_tp_np2_emulation_bits) [ "$gpus" -ge 2 ] && unexpected="$unexpected $t" ;;
      *) unexpected="$unexpected $t" ;;
    esac
  done
fi

echo
echo "================ gpu_check summary ================"
echo "GPUs: $gpus   build: $build   arch: $arch"
echo "GPU tests:  $(grep -E 'tests passed|tests failed' "$logs/gpu.log" | tail -1)"
echo "rest:       $(grep -E 'tests passed|tests failed' "$logs/rest.log" | tail -1)"
[ -n "$skipped" ] && echo "skipped GPU tests: $(tr "\n" " " <<<"$skipped")"
[ -n "$unexpected" ] && echo "UNEXPECTED skips with $gpus GPU(s):$unexpected"
[ "$gpus" -eq 0 ] && echo "note: no GPU visible: every GPU test skipped (this checks the build only)"
echo "logs: $logs/{gpu,rest}.log"
if [ "$gpu_rc" -ne 0 ] || [ "$rest_rc" -ne 0 ] || [ -n "$unexpected" ]; then
  echo "RESULT: FAIL"
  exit 1
fi
echo "RESULT: PASS"
