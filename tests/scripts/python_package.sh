#!/usr/bin/env bash
# The Python client as a user installs it: `pip install ./python` into a fresh venv (offline: no build isolation,
# numpy from the system), imported from outside the repository, attaching to a worker name nobody serves
# (UNAVAILABLE is the expected answer).
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Debian's python (its python3-venv, -wheel and -numpy), whatever python3 comes first on PATH.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-build-isolation --no-deps "$src/python" > "$tmp/pip.log" 2>&1 ||
  { cat "$tmp/pip.log"; exit 1; }
version=$("$tmp/venv/bin/pip" show dspark-client | sed -n 's/^Version: //p')
[ "$version" = "0.1.0" ] || { echo "FAIL: installed version '$version'"; exit 1; }
cd "$tmp"
DSPARK_CLIENT_LIB="$build/client/libdspark_client.so" "$tmp/venv/bin/python" - "$tmp" <<'PY'
import sys
import dspark_client as dc
assert dc.__file__.startswith(sys.argv[1] + "/venv/"), f"imported {dc.__file__}, not the installed module"
try:
    dc.Client("dspark-package-test", timeout_ms=200)
    sys.exit("FAIL: attached to a worker that should not exist")
except dc.DSparkError as e:
    assert e.status_name == "UNAVAILABLE", e
    print(e)
PY
echo "PASS: pip install ./python, imported from the venv"
