#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: install the dependencies, build, and run the main job on the
# embedded default (the tiny synthetic checkpoint on the CPU backend).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
"$root/scripts/run_main_job.sh"
