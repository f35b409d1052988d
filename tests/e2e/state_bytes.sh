#!/bin/sh
# state_bytes.sh TESSERA JOB.ini FRACTION: `tessera plan` predicts each rank's parameter, gradient
# and AdamW bytes by building its model; `tessera run` measures them after its first step. The
# two tables must agree line for line, and every rank must hold FRACTION of the 1-rank state.
set -eu
bin=$1 job=$2 fraction=$3
out=${TMPDIR:-/tmp}/tessera_state_bytes.$$
trap 'rm -f "$out".plan "$out".run' EXIT
"$bin" plan "$job" | sed -n '/^state per rank/,/^[^ ]/p' | sed 1d | grep '^  rank' >"$out".plan
"$bin" run "$job" --no-peak --stop-at 1 | sed -n '/^state per rank/,/^[^ ]/p' | sed 1d |
  grep '^  rank' >"$out".run
cat "$out".run
[ -s "$out".plan ] || { echo "plan printed no state table"; exit 1; }
diff "$out".plan "$out".run || { echo "plan and run disagree"; exit 1; }
if grep -v "= $fraction of 1 rank" "$out".run; then
  echo "a rank does not hold $fraction of the 1-rank state"
  exit 1
fi
echo "state bytes: plan == run, every rank $fraction of 1 rank"
