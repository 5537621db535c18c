#!/usr/bin/env bash
# Installs every build and run dependency of dspark from Debian 12's packages. Needs root, or sudo for a normal
# user; when every package is already installed it does nothing, so a normal user needs neither once root has
# run it.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libopenmpi-dev openmpi-bin
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev googletest
  python3 python3-numpy python3-matplotlib python3-venv python3-wheel procps clang-format
  prometheus-cpp-dev libmicrohttpd-dev
)
missing=()
for p in "${packages[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then missing+=("$p"); fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install_deps.sh: every dependency is installed"
  exit 0
fi
# sudo drops the environment: DEBIAN_FRONTEND goes through env.
as_root=(env DEBIAN_FRONTEND=noninteractive)
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install_deps.sh: missing packages: ${missing[*]}; run scripts/install_deps.sh as root (or install sudo)" >&2
    exit 1
  fi
  as_root=(sudo "${as_root[@]}")
fi
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}"
