#!/usr/bin/env bash
# dspark_client reports the protocol version it speaks: `--version`, and the `info` of an attach (against the
# tests' fake worker process). Usage: client_cli_version.sh CLIENT FAKE_WORKER
set -euo pipefail
client=$1
fake=$2
want="protocol version 7"

got=$("$client" --version)
if [ "$got" != "dspark_client: $want" ]; then
  echo "FAIL: --version printed '$got', expected 'dspark_client: $want'"
  exit 1
fi

ring="/dspark-cli-version-$$"
out=$(mktemp)
"$fake" "$ring" >"$out" &
fake_pid=$!
trap 'kill "$fake_pid" 2>/dev/null || true; wait "$fake_pid" 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 1 200); do
  grep -qx ready "$out" && break
  sleep 0.05
done
info=$("$client" --ring "$ring" --timeout-ms 5000 info)
line=$(grep '^protocol_version ' <<<"$info" || true)
if [ "$line" != "protocol_version 7" ]; then
  echo "FAIL: info printed '$line', expected 'protocol_version 7'"
  echo "$info"
  exit 1
fi
# The fake worker's taps (tests/client/fake_worker.cpp, fake_taps): layers 7, 9, 8 in row order, noise 998.
for want in "tapped_layers 7,9,8" "noise_token 998"; do
  if ! grep -qx "$want" <<<"$info"; then
    echo "FAIL: info lacks '$want'"
    echo "$info"
    exit 1
  fi
done
echo "PASS: --version and info report $want"
