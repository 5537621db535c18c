#!/usr/bin/env bash
# The main job on the embedded default: writes the tiny synthetic checkpoint (SPEC §2) to out/tiny-ckpt, inserts
# seeded context rows into two slots and drafts for both, printing tokens, confidences and margins.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DSPARK_BUILD_DIR:-$root/build}
ckpt=$root/out/tiny-ckpt
if [ ! -f "$ckpt/config.json" ]; then
  "$build/apps/dspark_make_ckpt" --preset tiny --seed 0 --out "$ckpt" --force
fi
"$build/apps/dspark_draft" "$ckpt" --random-rows 0:24 --random-rows 1:9 --seed 1 --json "$root/out/draft.json"
