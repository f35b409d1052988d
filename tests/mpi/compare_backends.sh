#!/bin/sh
# compare_backends.sh TESSERA JOB.ini OUT_PREFIX NP MPIRUN...
# Runs JOB under backend = local and under `MPIRUN -np NP` with backend = mpi, dumping the first
# step of each, then compares the dumps at rtol 1e-5 (prints "MATCH: 0 tensors ..." on success).
set -e
bin=$1 job=$2 out=$3 np=$4
shift 4
flags="--no-peak --no-progress"
"$bin" run "$job" $flags --dump "$out.local.safetensors" >"$out.local.log" 2>&1 || {
  cat "$out.local.log"
  exit 1
}
"$@" -np "$np" "$bin" run "$job" $flags --set job.backend=mpi --dump "$out.mpi.safetensors" \
  >"$out.mpi.log" 2>&1 || {
  cat "$out.mpi.log"
  exit 1
}
"$bin" compare "$out.local.safetensors" "$out.mpi.safetensors" --rtol 1e-5 --atol 1e-6
