#!/usr/bin/env bash
# The client as an engine's build gets it: install the build into a fresh prefix, build a project that uses
# find_package(dspark_client), run it against a worker name nobody serves (UNAVAILABLE is the expected answer).
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" --component client > "$tmp/install.log"
for f in include/dspark/dspark_client.h include/dspark/dspark_client.hpp; do
  [ -f "$tmp/prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
cmake -S "$src/tests/client/package_consumer" -B "$tmp/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
# The installed library is the one it runs with (the build tree's is not on the path).
# (ldd's output is kept first: grep -q closing the pipe early would fail the pipeline under pipefail.)
libs=$(ldd "$tmp/consumer/consumer")
grep -q "$tmp/prefix" <<< "$libs" || { echo "FAIL: not linked to the installed library"; echo "$libs"; exit 1; }
out=$("$tmp/consumer/consumer" "dspark-package-test-$$")
echo "$out"
echo "PASS: find_package(dspark_client) from an installed prefix"
