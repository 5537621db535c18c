#!/usr/bin/env bash
# dspark_make_ckpt refuses to write into a non-empty directory unless given --force, and says so (the README's
# command runs after setup.sh, which has made out/tiny-ckpt already); --force rewrites the same checkpoint.
# Usage: make_ckpt_existing_dir.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
make_ckpt=$build/apps/dspark_make_ckpt

"$make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" 2>/dev/null
cp "$work/ckpt/model.safetensors" "$work/first.safetensors"

rc=0
"$make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" 2>"$work/err" || rc=$?
if [ "$rc" -ne 1 ]; then
  echo "FAIL: a second run into the same directory exited $rc, expected 1" >&2
  exit 1
fi
if ! grep -q -- "directory is not empty.*--force" "$work/err"; then
  echo "FAIL: the refusal does not name --force:" >&2
  cat "$work/err" >&2
  exit 1
fi

"$make_ckpt" --preset tiny --seed 0 --out "$work/ckpt" --force 2>/dev/null
if ! cmp -s "$work/ckpt/model.safetensors" "$work/first.safetensors"; then
  echo "FAIL: --force with the same seed wrote a different checkpoint" >&2
  exit 1
fi
echo "PASS: refused without --force ($(cat "$work/err")); --force rewrote the same checkpoint"
