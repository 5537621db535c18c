#!/usr/bin/env bash
# scripts/compare_drafts.py against the golden case (shared/golden/tiny-v41): dspark_draft's answer PASSes
# against expected.json by the golden rule (margin 1e-3, no request may diverge); copies with one id or one
# confidence changed FAIL; a change past a near-tie PASSes. Exit 77 (skipped) without the golden case.
# Usage: compare_drafts_golden.sh BUILD_DIR SOURCE_DIR SHARED_DIR
set -euo pipefail
build=$1 src=$2 golden=$3/golden/tiny-v41
if [ ! -f "$golden/expected.json" ]; then
  echo "no golden case at $golden"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
compare=("${PYTHON:-python3}" "$src/scripts/compare_drafts.py")

# expect STATUS VERDICT ARGS...: compare_drafts.py ARGS exits STATUS and its last line starts with VERDICT.
expect() {
  local want=$1 verdict=$2 rc=0
  shift 2
  "${compare[@]}" "$@" >"$work/out" 2>&1 || rc=$?
  if [ "$rc" -ne "$want" ] || ! tail -n 1 "$work/out" | grep -q "^$verdict"; then
    echo "FAIL: compare_drafts.py $* exited $rc (expected $want, a last line starting '$verdict'):" >&2
    cat "$work/out" >&2
    exit 1
  fi
  echo "ok ($rc): $(tail -n 1 "$work/out")"
}

"$build/apps/dspark_draft" "$golden/ckpt" --rows "0:$golden/rows_slot0.npy" --rows "1:$golden/rows_slot1.npy" \
  --requests "$golden/requests.json" --json "$work/run.json" >/dev/null 2>&1

# The run against the golden answer: all 10 positions are compared (every margin exceeds 1e-3).
expect 0 "PASS: 10 of 10 positions" "$golden/expected.json" "$work/run.json"

# perturb FILE PYTHON-STATEMENT OUT: a copy of FILE with `d` (its JSON) changed by the statement.
perturb() {
  "${PYTHON:-python3}" -c "import json, sys; d = json.load(open(sys.argv[1])); $2; json.dump(d, open(sys.argv[2], 'w'))" \
    "$1" "$3"
}
perturb "$work/run.json" "d['ids'][1][2] += 1" "$work/id.json"
expect 1 "FAIL: 7 of 8 positions" "$golden/expected.json" "$work/id.json"
perturb "$work/run.json" "d['conf'][0][3] += 0.05" "$work/conf.json"
expect 1 "FAIL: 8 of 9 positions" "$golden/expected.json" "$work/conf.json"

# Request 0's first position is a near-tie (margin 0.0066): above --margin 0.01 nothing of it is compared, so a
# different token there passes; by the golden rule it fails.
perturb "$work/run.json" "d['ids'][0][0] += 1" "$work/tie.json"
expect 0 "PASS: 5 of 5 positions" "$golden/expected.json" "$work/tie.json" --margin 0.01
expect 1 "FAIL: 5 of 6 positions" "$golden/expected.json" "$work/tie.json"

# A run of other requests is not comparable; an unreadable file is an error (2), not a verdict.
perturb "$work/run.json" "d['requests'][1]['pos'] += 1" "$work/other-requests.json"
expect 1 "FAIL: step 0: the requests differ" "$golden/expected.json" "$work/other-requests.json"
expect 2 "error: cannot read" "$golden/expected.json" "$work/missing.json"
