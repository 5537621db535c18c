#!/usr/bin/env bash
# Checks that every C++/CUDA source is formatted by .clang-format (clang-format --dry-run -Werror). The style is
# pinned to clang-format 14 (Debian 12's, installed by install_deps.sh): other versions format some constructs
# differently, so with another version the check reports itself skipped (exit 77) instead of failing.
# Fix a failure with: clang-format -i FILE...
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tool=""
for candidate in clang-format-14 clang-format; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" --version | grep -q 'version 14\.'; then
    tool=$candidate
    break
  fi
done
if [ -z "$tool" ]; then
  echo "SKIP: clang-format 14 not found (scripts/install_deps.sh installs it)"
  exit 77
fi
mapfile -t files < <(find apps client comm kernels lib tests \
  -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
if "$tool" --dry-run -Werror "${files[@]}"; then
  echo "PASS: ${#files[@]} files formatted by .clang-format ($tool)"
else
  echo "FAIL: the files above differ from .clang-format; run: $tool -i FILE..."
  exit 1
fi
