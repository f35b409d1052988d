#!/bin/sh
# signal.sh TESSERA MATRIX_JOB DIR [MPIRUN...]: SIGTERM or SIGINT during `tessera run` finishes
# the step under way, writes the checkpoint at it when one is configured and exits 143 / 130
# with one line saying so; the checkpoint holds that step (a resume from it has nothing to run
# at that step) and the metrics end at it. On 8 thread ranks every rank stops at the same step.
# With the log's reader gone after the signal (Ctrl-C on `tessera run | tee`) the checkpoint is
# still written. A second SIGINT exits at once, writing nothing more. With MPIRUN, a signal to one
# rank process of a 2-process mpi job stops both at the same step. A stop that outlasts
# [job] stop_grace_s exits at once.
set -u
bin=$1 job=$2 dir=$3
shift 3
rm -rf "$dir"
mkdir -p "$dir"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
LONG="--no-peak --no-progress --set job.steps=1000000"
# a step of about half a second, for the second signal to land inside it
SLOW="--set model.hidden_size=256 --set model.intermediate_size=768 --set data.seq_len=128"

# wait_lines FILE N: until FILE has N lines (at most 60 s)
wait_lines() {
  i=0
  while [ "$(cat "$1" 2>/dev/null | wc -l)" -lt "$2" ] && [ $i -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
  done
}
# wait_for FILE RE: until FILE has a line matching RE (at most 60 s)
wait_for() {
  i=0
  while ! grep -q "$2" "$1" 2>/dev/null && [ $i -lt 6000 ]; do
    sleep 0.01
    i=$((i + 1))
  done
}
last_step() { tail -1 "$1" | sed 's/^{"step": \([0-9]*\),.*/\1/'; }
# holds C K [SETS...]: the checkpoint C holds step K (resuming it with --stop-at K has nothing
# to run)
holds() {
  c=$1 k=$2
  shift 2
  # shellcheck disable=SC2086
  "$bin" run "$job" $LONG "$@" --set checkpoint.load="$c" --stop-at "$k" 2>&1 |
    grep -q "nothing to run: the checkpoint is at step $k of $k"
}

# stop SIG CODE NAME [SETS...]: run, send SIG once steps are logged, check what is left
stop() {
  sig=$1 code=$2 name=$3
  shift 3
  d="$dir/$name"
  mkdir -p "$d"
  # shellcheck disable=SC2086
  "$bin" run "$job" $LONG --set output.metrics="$d/m.jsonl" "$@" >"$d/out" 2>"$d/err" &
  pid=$!
  wait_lines "$d/m.jsonl" 3
  kill "-$sig" $pid
  wait $pid
  rc=$?
  k=$(last_step "$d/m.jsonl")
  [ $rc = "$code" ] || { cat "$d/err"; fail "$name: exit $rc, want $code"; }
  grep -q "^tessera run: SIG$sig: stopping after the current step" "$d/err" || fail "$name: no acknowledgement"
  [ "$(grep -c "^tessera run: stopped by SIG$sig" "$d/err")" = 1 ] && grep -q "after step $k of 1000000" "$d/err" ||
    { cat "$d/err"; fail "$name: the line does not name step $k"; }
}

stop TERM 143 term --set checkpoint.save="$dir/term/c.safetensors"
grep -q "checkpoint written to $dir/term/c.safetensors" "$dir/term/err" || fail "term: checkpoint not named"
holds "$dir/term/c.safetensors" "$(last_step "$dir/term/m.jsonl")" || fail "term: the checkpoint is not at the last step"

stop INT 130 int
grep -q "no checkpoint written (\[checkpoint\] save is empty)" "$dir/int/err" || fail "int: line"

stop TERM 143 ranks8 --set mesh.shape=2,2,1,1,2 --set checkpoint.save="$dir/ranks8/c.safetensors"
holds "$dir/ranks8/c.safetensors" "$(last_step "$dir/ranks8/m.jsonl")" || fail "8 ranks: the checkpoint is not at the last step"

# the log's reader goes away right after the signal: the checkpoint is still written
d="$dir/reader"
mkdir -p "$d"
# shellcheck disable=SC2086
sh -c '"$@" & echo $! >"$0/pid"; wait $!; echo $? >"$0/rc"' "$d" "$bin" run "$job" $LONG $SLOW \
  --set checkpoint.save="$d/c.safetensors" --set output.metrics="$d/m.jsonl" 2>"$d/err" | cat >"$d/out" &
reader=$!
wait_lines "$d/m.jsonl" 1
kill -INT "$(cat "$d/pid")"
wait_for "$d/err" "stopping after the current step"
kill -KILL $reader
wait_lines "$d/rc" 1
[ "$(cat "$d/rc")" = 130 ] || { cat "$d/err"; fail "reader gone: exit $(cat "$d/rc")"; }
# shellcheck disable=SC2086
holds "$d/c.safetensors" "$(last_step "$d/m.jsonl")" $SLOW || fail "reader gone: no checkpoint at the last step"

# a second SIGINT exits at once: nothing more is written
d="$dir/twice"
mkdir -p "$d"
# shellcheck disable=SC2086
"$bin" run "$job" $LONG $SLOW --set checkpoint.save="$d/c.safetensors" --set output.metrics="$d/m.jsonl" \
  >"$d/out" 2>"$d/err" &
pid=$!
wait_lines "$d/m.jsonl" 1
kill -INT $pid
wait_for "$d/err" "stopping after the current step"
kill -INT $pid
wait $pid
rc=$?
[ $rc = 130 ] && grep -q "^tessera run: SIGINT again: exiting at once" "$d/err" && [ ! -e "$d/c.safetensors" ] &&
  ! grep -q "stopped by" "$d/err" || { cat "$d/err"; fail "twice: exit $rc"; }

# a step far longer than [job] stop_grace_s: the stop gives up on it and exits at once, saying
# so, and writes no checkpoint (`timeout` sends one SIGTERM only, which a wedged run ignored)
d="$dir/grace"
mkdir -p "$d"
# shellcheck disable=SC2086
"$bin" run "$job" $LONG --set model.hidden_size=1024 --set model.intermediate_size=4096 \
  --set data.seq_len=128 --set job.stop_grace_s=1 --set checkpoint.save="$d/c.safetensors" \
  >"$d/out" 2>"$d/err" &
pid=$!
wait_for "$d/out" "^model:"
start=$(date +%s)
kill -TERM $pid
wait $pid
rc=$?
took=$(($(date +%s) - start))
[ $rc = 143 ] && [ "$took" -le 4 ] && [ ! -e "$d/c.safetensors" ] &&
  grep -q "^tessera run: SIGTERM: the step and its checkpoint did not end within \[job\] stop_grace_s; exiting at once" "$d/err" ||
  { cat "$d/out" "$d/err"; fail "grace: exit $rc after $took s"; }

# mpi: one process signalled, both stop at the same step, rank 0 says so
if [ $# -gt 0 ]; then
  d="$dir/mpi"
  mkdir -p "$d"
  # shellcheck disable=SC2086
  "$@" -np 2 sh -c 'echo $$ >"$0/pid.$OMPI_COMM_WORLD_RANK"; exec "$@"' "$d" "$bin" run "$job" $LONG \
    --set job.backend=mpi --set mesh.shape=1,2,1,1,1 --set checkpoint.save="$d/c.safetensors" \
    --set output.metrics="$d/m.jsonl" >"$d/out" 2>"$d/err" &
  pid=$!
  wait_lines "$d/m.jsonl" 3
  kill -TERM "$(cat "$d/pid.1")"
  wait $pid
  rc=$?
  k=$(last_step "$d/m.jsonl")
  [ $rc != 0 ] && grep -q "^tessera run: stopped by SIGTERM after step $k of 1000000; checkpoint written" "$d/err" ||
    { cat "$d/err"; fail "mpi: exit $rc"; }
  holds "$d/c.safetensors" "$k" || fail "mpi: the checkpoint is not at the last step"
fi

[ $fails = 0 ] && echo "signal: ok"
