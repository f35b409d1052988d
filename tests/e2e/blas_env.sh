#!/bin/sh
# blas_env.sh TESSERA JOB: `tessera run` executes itself again with OPENBLAS_THREAD_TIMEOUT=18
# when the variable is unset (docs/kernels.md), so OpenBLAS's workers sleep soon after a GEMM
# instead of spinning; a value the user set is kept. Read from the environment of the running
# image (/proc/PID/environ shows the one its last exec was given). Skipped (77) without /proc.
set -u
bin=$1 job=$2
[ -r /proc/self/environ ] || { echo "blas env: no /proc, skipped"; exit 77; }
fail=0
# seen PID: the variable in the process's environment, polled while it starts ("" if never)
seen() {
  i=0 v=""
  while [ $i -lt 100 ] && [ -z "$v" ] && kill -0 "$1" 2>/dev/null; do
    v=$(tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^OPENBLAS_THREAD_TIMEOUT=//p')
    [ -n "$v" ] || sleep 0.1
    i=$((i + 1))
  done
  echo "$v"
}
# check WANT VALUE: a run started with the variable unset (VALUE "") or set to VALUE
check() {
  if [ -z "$2" ]; then
    env -u OPENBLAS_THREAD_TIMEOUT "$bin" run "$job" --no-peak --set job.steps=1000000 >/dev/null 2>&1 &
  else
    env OPENBLAS_THREAD_TIMEOUT="$2" "$bin" run "$job" --no-peak --set job.steps=1000000 >/dev/null 2>&1 &
  fi
  pid=$!
  got=$(seen $pid)
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  if [ "$got" = "$1" ]; then
    echo "ok: started with '${2:-unset}', runs with $got"
  else
    echo "FAIL: started with '${2:-unset}', runs with '${got:-unset}', want $1"
    fail=$((fail + 1))
  fi
}
check 18 ""
check 28 28
check 4 4
[ $fail -eq 0 ] && echo "blas env: ok"
