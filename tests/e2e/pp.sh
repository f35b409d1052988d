#!/bin/sh
# One step of JOB with [strategy.pp] schedule and microbatches replaced, dumped and compared with
# the dump REF of the 1-rank run; prints the pipeline line (peak microbatches in flight).
# usage: pp.sh TESSERA JOB OUTDIR SCHEDULE MICROBATCHES REF [run args...]
set -e
bin=$1 job=$2 out=$3 sched=$4 mb=$5 ref=$6
shift 6
name=$(basename "$job" .ini)_${sched}_$mb
mkdir -p "$out"
sed -e "s/^schedule = .*/schedule = $sched/" -e "s/^microbatches = .*/microbatches = $mb/" \
  "$job" > "$out/$name.ini"
"$bin" run "$out/$name.ini" --no-peak --dump "$out/$name.safetensors" "$@"
"$bin" compare "$out/$name.safetensors" "$ref" --rtol 1e-5 --atol 1e-6
