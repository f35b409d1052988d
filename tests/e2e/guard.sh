#!/bin/sh
# guard.sh TESSERA MATRIX_JOB DIR: [job] on_nonfinite. A gradient made NaN at step 3
# (TESSERA_TEST_NONFINITE) stops the default run with exit 1 naming the step, the batch rows and
# that parameter, saving nothing; with skip_step the run goes on, the message says the same, the
# weights and moments after step 3 are those after step 2, and a mesh of 8 ranks skips the same
# step with the same message and the same losses after it; a NaN loss is skipped naming the
# microbatch's rows; a bad value is refused.
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
P=model.layers.1.mlp.up_proj.weight
run() { "$bin" run "$job" --no-peak --json --set job.steps=4 "$@"; }
poisoned() { TESSERA_TEST_NONFINITE=3:$P run "$@"; }
MSG="step 3: the gradient norm is NaN on rows 0-7 of the step's batch; the first non-finite gradient is $P"

# stop (the default): exit 1, the step, rows and parameter named, nothing saved
out=$(poisoned --set checkpoint.save="$dir/stop.safetensors" 2>&1)
code=$?
{ [ $code = 1 ] && echo "$out" | grep -q "rank 0: $MSG: the run diverged and stops" &&
  ! echo "$out" | grep -q '"step": 3' && [ ! -e "$dir/stop.safetensors" ]; } ||
  { echo "$out"; fail "stop: exit $code"; }

# skip_step: the run goes on; step 3's record says why
poisoned --set job.on_nonfinite=skip_step >"$dir/skip.log" 2>&1 || { cat "$dir/skip.log"; fail "skip_step run"; }
grep '"step": 3' "$dir/skip.log" | grep -q "\"grad_norm\": null.*\"skipped\": \"$MSG: update skipped\"" ||
  { cat "$dir/skip.log"; fail "skip_step: step 3 is not reported skipped"; }
[ "$(grep -c '"skipped"' "$dir/skip.log")" = 1 ] || fail "skip_step: one step skipped expected"
grep '"step": 4' "$dir/skip.log" | grep -q '"grad_norm": [0-9]' || fail "skip_step: step 4 not finite"

# the skipped step changes no weight and no moment: the checkpoint at step 3 holds step 2's
run --stop-at 2 --set checkpoint.save="$dir/two.safetensors" >/dev/null 2>&1 || fail "stop at 2"
poisoned --set job.on_nonfinite=skip_step --stop-at 3 --set checkpoint.save="$dir/three.safetensors" \
  >/dev/null 2>&1 || fail "skip at 3"
"$bin" compare "$dir/three.safetensors" "$dir/two.safetensors" --rtol 0 --atol 0 | grep -q "MATCH: 0 tensors" &&
  "$bin" compare "$dir/three.optim.safetensors" "$dir/two.optim.safetensors" --rtol 0 --atol 0 |
  grep -q "MATCH: 0 tensors" || fail "the skipped step changed the weights or the moments"

# every rank agrees: pp x dp x tp skips the same step, names the same tensor, the same losses
poisoned --set job.on_nonfinite=skip_step --set mesh.shape=2,2,1,1,2 >"$dir/skip8.log" 2>&1 ||
  { tail -3 "$dir/skip8.log"; fail "skip_step on 8 ranks"; }
grep -q "\"skipped\": \"$MSG: update skipped\"" "$dir/skip8.log" || fail "8 ranks: not the same message"
grep '"grad_norm"' "$dir/skip.log" | sed 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/' >"$dir/one.loss"
grep '"grad_norm"' "$dir/skip8.log" | sed 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/' |
  paste -d' ' "$dir/one.loss" - | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5) bad = 1 }
    END { exit bad || NR != 4 }' || { cat "$dir/one.loss"; fail "8 ranks: losses differ from 1 rank"; }

# a NaN loss in the second of two microbatches: skipped, the microbatch's rows named; the
# gradients are finite (only the loss was made NaN), and the message says so
TESSERA_TEST_NONFINITE=2:loss:1 run --set job.on_nonfinite=skip_step --set optimizer.grad_accum_steps=2 \
  >"$dir/loss.log" 2>&1 || { cat "$dir/loss.log"; fail "NaN loss skip"; }
grep '"step": 2' "$dir/loss.log" | grep -q '"loss": null.*"skipped": "step 2: the loss is NaN on rows 4-7 of the step.s batch (microbatch 2 of 2); no gradient holds a NaN or an Inf: update skipped"' ||
  { cat "$dir/loss.log"; fail "NaN loss: not reported"; }
# the same under pp x dp (the pipeline's accumulation steps)
TESSERA_TEST_NONFINITE=2:loss:0 run --set job.on_nonfinite=skip_step --set optimizer.grad_accum_steps=2 \
  --set mesh.shape=2,2,1,1,1 >"$dir/loss4.log" 2>&1 || { tail -3 "$dir/loss4.log"; fail "NaN loss skip on 4 ranks"; }
grep -q '"skipped": "step 2: the loss is NaN on rows 0-3 of the step.s batch (microbatch 1 of 2)' "$dir/loss4.log" ||
  { cat "$dir/loss4.log"; fail "4 ranks: NaN loss not reported"; }

# the key's values
out=$(run --set job.on_nonfinite=skip 2>&1)
code=$?
[ $code = 2 ] && echo "$out" | grep -q -- "--set job.on_nonfinite: 'skip' is not one of stop | skip_step" ||
  { echo "$out"; fail "a bad on_nonfinite: exit $code"; }

[ $fails = 0 ] && echo "guard: ok"
