#!/usr/bin/env bash
# The operations files that cannot run here (no slurm, no systemd as init): scripts/dspark.slurm and
# scripts/dspark-launch parse (bash -n), the launcher's --help exits 0, and the example unit passes
# `systemd-analyze verify` with its /opt/dspark paths pointed at this tree (skipped where systemd-analyze is
# missing). Usage: ops_files.sh SOURCE_DIR
set -euo pipefail
src=$1
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
for f in scripts/dspark-launch scripts/dspark.slurm; do
  bash -n "$src/$f" || fail "$f does not parse"
  [ -x "$src/$f" ] || fail "$f is not executable"
done
grep -q '^#SBATCH --gpus-per-task=1$' "$src/scripts/dspark.slurm" || fail "dspark.slurm: no --gpus-per-task=1"
grep -q 'srun --mpi=pmix' "$src/scripts/dspark.slurm" || fail "dspark.slurm: no srun --mpi=pmix"
help=$("$src/scripts/dspark-launch" --help) || fail "dspark-launch --help exited $?"
grep -q '^Usage: dspark-launch' <<<"$help" || fail "dspark-launch --help: $help"
echo "ok: bash -n on dspark-launch and dspark.slurm, dspark-launch --help"

unit=$src/scripts/systemd/dspark.service
for key in 'KillMode=mixed' 'KillSignal=SIGTERM' 'Restart=on-failure' 'RestartPreventExitStatus=64'; do
  grep -qx "$key" "$unit" || fail "dspark.service: no $key"
done
if ! command -v systemd-analyze >/dev/null; then
  echo "note: no systemd-analyze here: dspark.service not verified"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed "s|/opt/dspark|$src|g" "$unit" >"$work/dspark.service"
out=$(systemd-analyze verify "$work/dspark.service" 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
echo "ok: systemd-analyze verify dspark.service"
