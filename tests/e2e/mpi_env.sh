#!/bin/sh
# mpi_env.sh TESSERA JOB DIR: a job with backend = local started by an MPI launcher as one of
# several processes (the launcher's environment says so) is refused, by run and plan, naming
# [job] backend and backend = mpi: each process would run the whole job and write the same
# files. A launcher's world of one, or none, runs.
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
fails=0
# expect CODE REGEX VAR=VALUE CMD...: CMD with VAR set exits CODE, matches REGEX, takes no step
expect() {
  want=$1 re=$2 var=$3
  shift 3
  out=$(env "$var" "$@" 2>&1)
  code=$?
  if [ "$code" != "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$re" ||
    { [ "$want" != 0 ] && printf '%s\n' "$out" | grep -q '^step '; }; then
    printf 'FAILED (exit %s, want %s, /%s/): %s %s\n%s\n' "$code" "$want" "$re" "$var" "$*" "$out"
    fails=$((fails + 1))
  fi
}
msg="\[job\] backend: local, but an MPI launcher started this process as one of several"
expect 2 "$msg (OMPI_COMM_WORLD_SIZE=2).*Set backend = mpi" OMPI_COMM_WORLD_SIZE=2 \
  "$bin" run "$job" --no-peak --no-progress
expect 2 "$msg (PMI_SIZE=4)" PMI_SIZE=4 "$bin" run "$job" --no-peak --no-progress
expect 2 "$msg (MV2_COMM_WORLD_SIZE=2)" MV2_COMM_WORLD_SIZE=2 "$bin" plan "$job"
# a process of rank > 0 under a launcher that gives no size: refused (rank 0 alone speaks)
expect 2 "" PMIX_RANK=1 "$bin" run "$job" --no-peak --no-progress
# one process: the job runs
expect 0 "^step *1/1" OMPI_COMM_WORLD_SIZE=1 "$bin" run "$job" --no-peak --no-progress
[ "$fails" = 0 ] && echo "mpi env: ok"
