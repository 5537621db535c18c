#!/usr/bin/env bash
# Runs a command whose ranks share a GPU. By default the ranks take turns on it (time-slicing): the GPU
# switches between the processes, so a rank always runs while the others' peer kernels spin on it. With
# DSPARK_MPS=1, on a host with an NVIDIA GPU and nvidia-cuda-mps-control, the command runs under an MPS
# control daemon of its own (told to quit when the command ends) and the ranks' kernels run side by side. MPS
# has no such switching: a rank can be held up while the others spin (test_cuda_tp at 4 ranks on one H200
# stalled at its first drafter exchange in one run of two), so it is for experiments. With k ranks per GPU
# (mpirun's -np over the GPUs) the daemon gives each client at most 100 / k % of a GPU's SMs, as the worker
# asks for itself. Usage: shared_gpu.sh command [args...]
set -uo pipefail
# Every kernel loaded at start: a kernel loaded lazily at its first launch may wait for the GPU's other work,
# and another rank's peer kernel spinning on this rank is such work (the worker does the same when its
# device_map shares a GPU).
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
dir=""
if [ "${DSPARK_MPS:-0}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null 2>&1 &&
  nvidia-smi -L >/dev/null 2>&1; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/dspark-mps.XXXXXX")
  export CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    ranks=1
    prev=""
    for a in "$@"; do
      case $prev in -np | -n | --np) ranks=$a ;; esac
      prev=$a
    done
    gpus=$(nvidia-smi -L | wc -l)
    per_gpu=$(((ranks + gpus - 1) / gpus))
    [ "$per_gpu" -gt 1 ] && echo "set_default_active_thread_percentage $((100 / per_gpu))" | nvidia-cuda-mps-control >/dev/null
    echo "shared_gpu: MPS control daemon in $dir ($per_gpu rank(s) per GPU, each at most $((100 / per_gpu)) % of its SMs)"
  else
    echo "shared_gpu: the MPS daemon did not start: the ranks take turns on the GPU (time-slicing)"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    rm -rf "$dir"
    dir=""
  fi
else
  echo "shared_gpu: the ranks take turns on the GPU (time-slicing)"
fi
"$@"
rc=$?
if [ -n "$dir" ]; then
  echo quit | nvidia-cuda-mps-control
  for _ in $(seq 50); do  # the daemon leaves once its clients are gone
    pgrep -f "nvidia-cuda-mps-control -d" >/dev/null 2>&1 || break
    sleep 0.1
  done
  rm -rf "$dir"
fi
exit $rc
