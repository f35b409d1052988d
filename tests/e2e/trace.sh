#!/bin/sh
# trace.sh TESSERA TRACE_CHECK MATRIX_JOB DIR: [output] trace works for every mesh. Under 1
# rank, dp, tp, ring_cp, pp and pp x dp x tp the file is valid JSON with a track per rank, and
# every rank has its steps, its ops forward and backward and, on a mesh of more than one rank,
# its communication per mesh dim with bytes; pipeline actions appear only with pp; slices nest
# on each track (trace_check.c says how); a forward run is traced too.
set -u
bin=$1 check=$2 job=$3 dir=$4
rm -rf "$dir"
mkdir -p "$dir"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}

# shape world dims-that-communicate pipeline
for c in "1,1,1,1,1 1 - 0" "1,2,1,1,1 2 dp 0" "1,1,1,1,2 2 tp 0" "1,1,2,1,1 2 ring_cp 0" \
  "2,1,1,1,1 2 pp 1" "2,2,1,1,2 8 pp,dp,tp 1"; do
  set -- $c
  out="$dir/$1.json"
  "$bin" run "$job" --no-peak --no-progress --set job.steps=2 --set mesh.shape="$1" \
    --set output.trace="$out" >"$dir/$1.log" 2>&1 || { tail -3 "$dir/$1.log"; fail "mesh $1"; continue; }
  dims=$3
  [ "$dims" = - ] && dims=
  "$check" "$out" "$2" "${dims:--}" "$4" 2 train || fail "mesh $1"
done

# forward mode: ops forward only, no optimizer phase
"$bin" run "$job" --no-peak --no-progress --set job.mode=forward --set job.steps=1 \
  --set mesh.shape=1,1,1,1,2 --set output.trace="$dir/fwd.json" >"$dir/fwd.log" 2>&1 || fail "forward"
"$check" "$dir/fwd.json" 2 tp 0 1 forward || fail "forward trace"
grep -q '"optimizer' "$dir/fwd.json" && fail "forward trace has an optimizer phase"

[ $fails = 0 ] && echo "trace: ok"
