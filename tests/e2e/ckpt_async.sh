#!/bin/sh
# ckpt_async.sh TESSERA JOB OUT [MPIRUN...]: [checkpoint] async = true. Runs saving every 2 steps
# of 6 with and without async write the same bytes (every file of step-000002, -4 and -6); a run
# resumed from the async step-000004 ends bit for bit where the run resumed from the sync one ends,
# which is where the uninterrupted run ends. On 1 rank, on pp 2 x dp 2 x tp 2 and on dp 2 x tp 2
# of the emulated device; with MPIRUN (the mpi backend built), on 4 mpi processes (dp 2 x tp 2)
# instead. Without MPIRUN also: a background write that fails on rank 1 (TESSERA_TEST_SAVE_FAIL)
# stops the run with exit 2 and a message naming the step, leaves no folder of that step, final
# or temporary, and the previous checkpoint resumes; and the key's errors name the file and line.
set -u
bin=$1 job=$2 out=$3
shift 3
mpirun="$*"
rm -rf "$out"
mkdir -p "$out"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
flags="--no-peak --no-progress --set job.steps=6"
if [ -n "$mpirun" ]; then
  run() { $mpirun -np 4 "$bin" run "$job" $flags --set job.backend=mpi "$@"; }
else
  run() { "$bin" run "$job" $flags "$@"; }
fi
# pair NAME --set ...: sync and async saves byte for byte; resumes from either at step 4 equal
pair() {
  name=$1
  shift
  d="$out/$name"
  run "$@" --set checkpoint.dir="$d.sync" --set checkpoint.every=2 \
    --set checkpoint.save="$d.full6.safetensors" >"$d.sync.log" 2>&1 ||
    { fail "$name: sync run"; cat "$d.sync.log"; }
  run "$@" --set checkpoint.dir="$d.async" --set checkpoint.every=2 --set checkpoint.async=true \
    >"$d.async.log" 2>&1 || { fail "$name: async run"; cat "$d.async.log"; }
  grep -q "^checkpoint: step 2 copied to host memory" "$d.async.log" &&
    grep -q "^checkpoint: step 4 saved to .*step-000004 in .* in the background" "$d.async.log" ||
    { fail "$name: the async run did not save in the background"; cat "$d.async.log"; }
  grep "in the background" "$d.async.log" | head -2
  for s in 000002 000004 000006; do
    a=$(cd "$d.async/step-$s" 2>/dev/null && ls | tr '\n' ' ')
    b=$(cd "$d.sync/step-$s" 2>/dev/null && ls | tr '\n' ' ')
    [ -n "$b" ] && [ "$a" = "$b" ] || { fail "$name: step-$s holds '$a' async, '$b' sync"; continue; }
    for f in $b; do
      cmp -s "$d.async/step-$s/$f" "$d.sync/step-$s/$f" || fail "$name: step-$s/$f differs"
    done
  done
  ls -A "$d.async" | grep -q '\.tmp$' && fail "$name: a temporary is left in the async dir"
  for k in sync async; do
    run "$@" --set checkpoint.load="$d.$k/step-000004" --set checkpoint.save="$d.r$k.safetensors" \
      >"$d.r$k.log" 2>&1 || { fail "$name: resume from $k"; cat "$d.r$k.log"; }
    grep -q "resumed from .* at step 4" "$d.r$k.log" || fail "$name: $k: did not resume at step 4"
  done
  for f in "" .optim; do
    cmp -s "$d.rasync$f.safetensors" "$d.rsync$f.safetensors" ||
      fail "$name: resumed from async, $f differs from resumed from sync"
    cmp -s "$d.rasync$f.safetensors" "$d.full6$f.safetensors" ||
      fail "$name: resumed from async, $f differs from the uninterrupted run"
  done
}
if [ -n "$mpirun" ]; then
  pair mpi --set mesh.dims=dp,tp --set mesh.shape=2,2
  [ "$fails" = 0 ] && echo "ckpt async: ok (mpi)"
  exit 0
fi
pair one --set mesh.dims=dp --set mesh.shape=1
pair 3d --set mesh.dims=pp,dp,tp --set mesh.shape=2,2,2
# on a device the snapshot is a device-to-host copy
pair emu --set mesh.dims=dp,tp --set mesh.shape=2,2 --set job.device=emu

# a background write that fails (rank 1's, step 4) stops the run, and leaves step 2 the latest
d="$out/fail"
TESSERA_TEST_SAVE_FAIL=4:1 run --set mesh.dims=dp,tp --set mesh.shape=2,2 --set checkpoint.dir="$d" \
  --set checkpoint.every=2 --set checkpoint.async=true >"$d.log" 2>&1
code=$?
[ "$code" = 2 ] || fail "a failed background write: exit $code, not 2 (as a failed sync save)"
grep -Eq "checkpoint.async: the background save of step 4 failed, so .*step-000004 was not written \\(the checkpoint before it is still the latest\\)" "$d.log" ||
  { fail "a failed background write is not reported"; cat "$d.log"; }
grep -q "rank-00001.safetensors" "$d.log" || fail "the message does not name the file that failed"
left=$(ls -A "$d" | tr '\n' ' ')
[ "$left" = "step-000002 " ] || fail "after a failed background write the dir holds: $left"
run --set mesh.dims=dp,tp --set mesh.shape=2,2 --set checkpoint.dir="$d" --set checkpoint.load=latest \
  >"$d.resume.log" 2>&1 && grep -q "resumed from latest at step 2" "$d.resume.log" ||
  { fail "step 2 does not resume after the failed write"; cat "$d.resume.log"; }

# the key's errors: exit 2, the file, the line and the fix
line=$(($(wc -l <"$job") + 3))
expect() {
  name=$1 re=$2 keys=$3
  { cat "$job"; printf '\n[checkpoint]\n%s\n' "$keys"; } >"$out/$name.ini"
  "$bin" run "$out/$name.ini" --no-peak --no-progress >"$out/$name.log" 2>&1
  code=$?
  { [ "$code" = 2 ] && grep -Eq "$re" "$out/$name.log"; } || { fail "$name (exit $code)"; cat "$out/$name.log"; }
}
expect nodir "nodir\.ini:$line: \[checkpoint\] async: true without \[checkpoint\] dir: async applies to the sharded saves of dir; set dir, or remove async" "async = true"
expect notbool "notbool\.ini:$line: \[checkpoint\] async.*(true|false)" "async = yes"
[ "$fails" = 0 ] && echo "ckpt async: ok"
