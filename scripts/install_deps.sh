#!/usr/bin/env bash
# Installs every build and run dependency of dspark from Debian 12's packages.
# Idempotent: apt-get skips what is already there. Needs root (or sudo).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config git ca-certificates \
  libopenmpi-dev openmpi-bin \
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev \
  libgtest-dev libgmock-dev googletest \
  python3 python3-numpy procps clang-format
