#!/usr/bin/env bash
# Runs a command (several ranks sharing a GPU) under an MPS control daemon of its own, when this host has an
# NVIDIA GPU and nvidia-cuda-mps-control: the ranks' kernels then run side by side instead of taking turns
# (a peer handshake in microseconds instead of milliseconds). Without either, or when the daemon does not
# start, the command runs under plain time-slicing: slower, the same bits. DSPARK_NO_MPS=1 skips MPS.
# The daemon is told to quit when the command ends. Usage: with_mps.sh command [args...]
set -uo pipefail
# Every kernel loaded at start: a kernel loaded lazily at its first launch may wait for the GPU's other work,
# and another rank's peer kernel spinning on this rank is such work (the worker does the same when its
# device_map shares a GPU).
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
dir=""
if [ "${DSPARK_NO_MPS:-0}" != 1 ] && command -v nvidia-cuda-mps-control >/dev/null 2>&1 &&
  nvidia-smi -L >/dev/null 2>&1; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/dspark-mps.XXXXXX")
  export CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    echo "with_mps: MPS control daemon in $dir"
  else
    echo "with_mps: the MPS daemon did not start: the ranks take turns on the GPU (time-slicing)"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    rm -rf "$dir"
    dir=""
  fi
else
  echo "with_mps: no MPS here: the ranks take turns on the GPU (time-slicing)"
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
