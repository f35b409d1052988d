#!/bin/sh
# ckpt_sharded_kill.sh TESSERA JOB DIR: a run saving sharded checkpoints every 2 steps
# ([checkpoint] dir, every = 2, keep_last = 1) killed with SIGKILL at each point of its step-4
# save (TESSERA_TEST_SAVE_KILL, apps/train_ckpt.c) over a complete step-2 checkpoint. Before the
# rename no step-000004 exists, only the temporary .step-000004.tmp, and load = latest resumes
# step 2; once renamed, step 4 is complete and resumed (keep_last has not removed step 2 yet:
# nothing is pruned before the new folder is complete). Either way the resumed run ends at step 6
# bit for bit where the uninterrupted run ends, and its saves remove the temporary and the
# folders beyond keep_last. JOB runs on 4 ranks (dp 2 x tp 2), so a save writes several files.
# Then SIGTERM: the run stops after the step under way with its checkpoint in the dir, named on
# stderr, and that checkpoint resumes. With a 4th argument `async`, every run has [checkpoint]
# async = true and the killed runs stop at step 5, so that the step-4 save is written in the
# background while step 5 runs: the kill points are then on the writer thread (shard-written) and
# where the run completes the background save; the SIGTERM run saves every 3 steps in the
# background too.
set -u
bin=$1 job=$2 dir=$3 mode=${4:-sync}
stop=4 async="" term_every=0
[ "$mode" = async ] && stop=5 async="--set checkpoint.async=true" term_every=3
rm -rf "$dir"
mkdir -p "$dir"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
run() {
  "$bin" run "$job" --no-peak --no-progress --set job.steps=6 --set mesh.dims=dp,tp \
    --set mesh.shape=2,2 "$@"
}
run --set checkpoint.save="$dir/full6.safetensors" >"$dir/full.log" 2>&1 || fail "uninterrupted run"
run --stop-at 2 --set checkpoint.dir="$dir/good" --set checkpoint.every=2 $async >/dev/null 2>&1 ||
  fail "step 2"
for point in shard-written shards-written index-written renamed; do
  d="$dir/$point"
  cp -r "$dir/good" "$d"
  TESSERA_TEST_SAVE_KILL=$point run --stop-at $stop $async --set checkpoint.dir="$d" --set checkpoint.every=2 \
    --set checkpoint.keep_last=1 --set checkpoint.load=latest >"$d.kill.log" 2>&1
  code=$?
  [ "$code" = 137 ] || { fail "$point: the run was not killed (exit $code)"; cat "$d.kill.log"; }
  case $point in
    renamed) from=4 ;;
    *)
      from=2
      [ -e "$d/step-000004" ] && fail "$point: a step-000004 exists before its save completed"
      [ -d "$d/.step-000004.tmp" ] || fail "$point: no temporary folder left by the killed save"
      ;;
  esac
  [ -f "$d/step-000002/index.json" ] || fail "$point: the previous checkpoint is gone"
  run $async --set checkpoint.dir="$d" --set checkpoint.every=2 --set checkpoint.keep_last=1 \
    --set checkpoint.load=latest --set checkpoint.save="$d.6.safetensors" >"$d.log" 2>&1 ||
    { fail "$point: resume failed"; cat "$d.log"; continue; }
  grep -q "resumed from .* at step $from" "$d.log" ||
    { fail "$point: did not resume at step $from"; cat "$d.log"; }
  cmp -s "$d.6.safetensors" "$dir/full6.safetensors" &&
    cmp -s "$d.6.optim.safetensors" "$dir/full6.optim.safetensors" ||
    fail "$point: step 6 differs from the uninterrupted run"
  left=$(ls -A "$d" | tr '\n' ' ')
  [ "$left" = "step-000006 " ] || fail "$point: left in the dir after keep_last = 1: $left"
done
# SIGTERM: the step under way finishes and its checkpoint goes to the dir, named on stderr
d="$dir/term"
"$bin" run "$job" --no-peak --no-progress --set job.steps=1000000 --set checkpoint.dir="$d" \
  $async --set checkpoint.every=$term_every >"$d.log" 2>"$d.err" &
pid=$!
i=0
while [ "$i" -lt 100 ] && ! grep -q "^step" "$d.log" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
kill -TERM "$pid"
wait "$pid"
code=$?
[ "$code" = 143 ] || fail "SIGTERM: exit $code"
at=$(sed -n 's/.*checkpoint written to .*\/step-0*\([0-9][0-9]*\) (resume with \[checkpoint\] load = latest)$/\1/p' "$d.err")
[ -n "$at" ] && [ -f "$d/step-$(printf %06d "$at")/index.json" ] ||
  { fail "SIGTERM: no checkpoint named and written"; cat "$d.err"; }
"$bin" run "$job" --no-peak --no-progress --set job.steps=$((at + 1)) --set checkpoint.dir="$d" \
  --set checkpoint.load=latest >"$d.resume.log" 2>&1 &&
  grep -q "resumed from latest at step $at" "$d.resume.log" || fail "SIGTERM: its checkpoint does not resume"
[ "$fails" = 0 ] && echo "ckpt sharded kill: ok (and SIGTERM; $mode)"
