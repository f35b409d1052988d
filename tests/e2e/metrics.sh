#!/bin/sh
# metrics.sh TESSERA JSONL_CHECK MATRIX_JOB DIR: [output] metrics. One JSON object per step and
# per evaluation, with the log's figures; rank 0 alone writes it under pp x dp x tp; a resumed
# run keeps the lines up to its checkpoint and appends; a run that fails keeps the lines of the
# steps it logged; the path is checked before the run like every output (missing directory, a
# directory, the same file as another output or the job file), a relative --set is taken from
# the current directory, a symlink there is replaced and the mode of a replaced file kept; plan
# writes neither the metrics nor the trace.
set -u
bin=$1 check=$2 job=$3 dir=$4
rm -rf "$dir"
mkdir -p "$dir"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
run() { "$bin" run "$job" --no-peak --no-progress --set job.steps=4 "$@"; }
EVAL="--set eval.source=synthetic --set eval.every=2"
# "STEP KIND" per line
kinds() { sed 's/^{"step": \([0-9]*\), "kind": "\([a-z]*\)".*/\1 \2/' "$1" | tr '\n' ' '; }

# shellcheck disable=SC2086
run $EVAL --json --set output.metrics="$dir/m.jsonl" >"$dir/m.log" 2>&1 || { cat "$dir/m.log"; fail "run"; }
"$check" "$dir/m.jsonl" >/dev/null || { "$check" "$dir/m.jsonl"; fail "not JSON lines"; }
[ "$(kinds "$dir/m.jsonl")" = "1 train 2 train 2 eval 3 train 4 train 4 eval " ] ||
  fail "records: $(kinds "$dir/m.jsonl")"
for k in loss lr grad_norm tokens_per_s flops_per_s mfu peak_bytes peak_bytes_min secs time; do
  [ "$(grep -c "\"kind\": \"train\".*\"$k\": " "$dir/m.jsonl")" = 4 ] || fail "train records lack $k"
done
for k in eval_loss eval_ppl eval_batches eval_tokens; do
  [ "$(grep -c "\"kind\": \"eval\".*\"$k\": " "$dir/m.jsonl")" = 2 ] || fail "eval records lack $k"
done
# the same figures as the log
grep '"grad_norm"' "$dir/m.log" | sed 's/^{"step": \([0-9]*\), "loss": \([^,]*\), "lr": \([^,]*\), "grad_norm": \([^,]*\),.*/\1 \2 \3 \4/' >"$dir/a"
grep '"kind": "train"' "$dir/m.jsonl" | sed 's/^{"step": \([0-9]*\),.*"loss": \([^,]*\), "lr": \([^,]*\), "grad_norm": \([^,]*\),.*/\1 \2 \3 \4/' >"$dir/b"
cmp -s "$dir/a" "$dir/b" || { paste "$dir/a" "$dir/b"; fail "metrics differ from the log"; }
grep '"eval_loss"' "$dir/m.log" | sed 's/.*"eval_loss": \([^,]*\),.*/\1/' >"$dir/a"
grep '"kind": "eval"' "$dir/m.jsonl" | sed 's/.*"eval_loss": \([^,]*\),.*/\1/' >"$dir/b"
cmp -s "$dir/a" "$dir/b" || fail "eval loss differs from the log"

# rank 0 alone writes: one record per step on 8 ranks
# shellcheck disable=SC2086
run $EVAL --set mesh.shape=2,2,1,1,2 --set output.metrics="$dir/m8.jsonl" >/dev/null 2>&1 || fail "8 ranks"
[ "$(kinds "$dir/m8.jsonl")" = "1 train 2 train 2 eval 3 train 4 train 4 eval " ] ||
  fail "8 ranks: $(kinds "$dir/m8.jsonl")"

# resume: the lines up to the checkpoint stay, the rest follow once
echo '{"step": 9, "kind": "train"}' >"$dir/r.jsonl"
# shellcheck disable=SC2086
run $EVAL --stop-at 3 --set checkpoint.save="$dir/c.safetensors" --set output.metrics="$dir/r.jsonl" \
  >/dev/null 2>&1 || fail "first part"
[ "$(kinds "$dir/r.jsonl")" = "1 train 2 train 2 eval 3 train 3 eval " ] || fail "first part: $(kinds "$dir/r.jsonl")"
# a line of a step past the checkpoint (as a run killed after it would leave) goes
echo '{"step": 4, "kind": "train", "loss": 1}' >>"$dir/r.jsonl"
# shellcheck disable=SC2086
run $EVAL --set checkpoint.load="$dir/c.safetensors" --set output.metrics="$dir/r.jsonl" \
  >/dev/null 2>&1 || fail "resumed part"
[ "$(kinds "$dir/r.jsonl")" = "1 train 2 train 2 eval 3 train 3 eval 4 train 4 eval " ] ||
  fail "resumed: $(kinds "$dir/r.jsonl")"
"$check" "$dir/r.jsonl" >/dev/null || fail "resumed: not JSON lines"

# a run that fails at step 3 keeps the lines of steps 1 and 2
TESSERA_TEST_NONFINITE=3:model.norm.weight run --set output.metrics="$dir/f.jsonl" >/dev/null 2>&1
[ $? = 1 ] || fail "the poisoned run did not fail"
[ "$(kinds "$dir/f.jsonl")" = "1 train 2 train " ] || fail "failed run: $(kinds "$dir/f.jsonl")"

# a relative --set from the current directory; the mode of a replaced file; a symlink replaced
mkdir -p "$dir/cwd"
echo old >"$dir/cwd/rel.jsonl"
chmod 640 "$dir/cwd/rel.jsonl"
(cd "$dir/cwd" && "$bin" run "$job" --no-peak --set job.steps=1 --set output.metrics=rel.jsonl >/dev/null 2>&1) ||
  fail "relative path"
[ "$(kinds "$dir/cwd/rel.jsonl")" = "1 train " ] || fail "relative path not from the current directory"
[ "$(stat -c %a "$dir/cwd/rel.jsonl")" = 640 ] || fail "mode not kept: $(stat -c %a "$dir/cwd/rel.jsonl")"
echo precious >"$dir/target.txt"
ln -s target.txt "$dir/link.jsonl"
run --set job.steps=1 --set output.metrics="$dir/link.jsonl" >/dev/null 2>&1 || fail "symlink run"
[ "$(cat "$dir/target.txt")" = precious ] && [ ! -L "$dir/link.jsonl" ] || fail "the symlink was followed"

# plan's check step writes neither the metrics nor the trace
echo keep >"$dir/p.jsonl"
printf '[output]\nmetrics = %s\ntrace = %s\n[eval]\nsource = synthetic\n' "$dir/p.jsonl" "$dir/p.json" |
  cat "$job" - >"$dir/p.ini"
"$bin" plan "$dir/p.ini" >"$dir/p.log" 2>&1 || { cat "$dir/p.log"; fail "plan"; }
[ "$(cat "$dir/p.jsonl")" = keep ] && [ ! -e "$dir/p.json" ] || fail "plan wrote the metrics or the trace"

# checked before the run like every output
expect() {
  want=$1 re=$2
  shift 2
  out=$("$@" 2>&1)
  code=$?
  if [ "$code" != "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$re" ||
    printf '%s\n' "$out" | grep -q '^step '; then
    printf 'FAILED (exit %s, want %s, /%s/): %s\n%s\n' "$code" "$want" "$re" "$*" "$out"
    fails=$((fails + 1))
  fi
}
expect 2 "--set output.metrics: .*/none/m.jsonl: its directory .* does not exist" \
  run --set output.metrics="$dir/none/m.jsonl"
expect 2 "--set output.metrics: .* is a directory" run --set output.metrics="$dir"
expect 2 "--set output.metrics: .*/t.json is also \[output\] trace" \
  run --set output.trace="$dir/t.json" --set output.metrics="$dir/t.json"
expect 2 "--set output.metrics: .* is the same file as the job file" run --set output.metrics="$job"
expect 2 "plan.ini:[0-9]*: \[output\] metrics: .*/none/m.jsonl: its directory" \
  sh -c "printf '[output]\nmetrics = $dir/none/m.jsonl\n' | cat \"$job\" - >\"$dir/plan.ini\" && \"$bin\" plan \"$dir/plan.ini\""

[ $fails = 0 ] && echo "metrics: ok"
