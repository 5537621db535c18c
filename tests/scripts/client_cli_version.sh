#!/usr/bin/env bash
# dspark_client reports the protocol version it speaks: `--version`, and the `info` of an attach (against the
# tests' fake worker process). Usage: client_cli_version.sh CLIENT FAKE_WORKER
set -euo pipefail
client=$1
fake=$2
want="protocol version 4"

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
if [ "$line" != "protocol_version 4" ]; then
  echo "FAIL: info printed '$line', expected 'protocol_version 4'"
  echo "$info"
  exit 1
fi
echo "PASS: --version and info report $want"
