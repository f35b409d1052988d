#!/bin/sh
# eval.sh TESSERA MATRIX_JOB TEXT DIR: [eval] on held-out data. Its loss under dp, tp, pp and
# their product equals the 1-rank one; the training run is the same with and without it (losses,
# gradient norms and the checkpoint, byte for byte); a text source with microbatches works; keys
# that ask for an evaluation without a source, an evaluation in forward mode and a missing file
# are refused before any step.
set -u
bin=$1 job=$2 text=$3 dir=$4
rm -rf "$dir"
mkdir -p "$dir"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
run() { "$bin" run "$job" --no-peak --json --set job.steps=4 "$@"; }
EVAL="--set eval.source=synthetic --set eval.every=2 --set eval.batches=3"

# the eval records: "STEP LOSS" per line
evals() { grep '"eval_loss"' "$1" | sed 's/^{"step": \([0-9]*\), "eval_loss": \([^,]*\),.*/\1 \2/'; }
# the training records without their timings: step, loss, lr, grad norm
steps() { grep '"grad_norm"' "$1" | sed 's/, "secs".*//'; }

# shellcheck disable=SC2086
run $EVAL --set checkpoint.save="$dir/one.safetensors" >"$dir/one.log" 2>&1 || {
  cat "$dir/one.log"
  fail "the 1-rank run with eval"
}
[ "$(evals "$dir/one.log" | wc -l)" = 2 ] || fail "2 evaluations expected in 4 steps, every 2: $(evals "$dir/one.log")"
evals "$dir/one.log" | awk '$2 + 0 <= 0 || $2 != $2 + 0 { exit 1 }' || fail "eval loss not a positive number"

# every mesh: pp x dp x ring_cp x ulysses_cp x tp
for shape in 1,2,1,1,1 1,1,1,1,2 2,1,1,1,1 2,2,1,1,2 1,1,2,1,1; do
  # shellcheck disable=SC2086
  run $EVAL --set mesh.shape=$shape --set checkpoint.save="$dir/$shape.safetensors" \
    >"$dir/$shape.log" 2>&1 || {
    tail -3 "$dir/$shape.log"
    fail "mesh $shape"
    continue
  }
  evals "$dir/$shape.log" >"$dir/$shape.evals"
  evals "$dir/one.log" | paste -d' ' - "$dir/$shape.evals" | awk -v m="$shape" '
    { d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5 * $2) { print "mesh " m ": step " $1 " eval " $2 " vs " $4; bad = 1 } }
    END { exit bad || NR != 2 }' || fail "mesh $shape: eval differs from the 1-rank eval"
done

# the training is untouched by the evaluations: 1 rank and pp x dp x tp
run --set checkpoint.save="$dir/plain.safetensors" >"$dir/plain.log" 2>&1 || fail "the run without eval"
[ "$(steps "$dir/plain.log")" = "$(steps "$dir/one.log")" ] || fail "training records differ with eval"
cmp -s "$dir/plain.safetensors" "$dir/one.safetensors" || fail "the checkpoint differs with eval"
run --set mesh.shape=2,2,1,1,2 --set checkpoint.save="$dir/plain8.safetensors" >"$dir/plain8.log" 2>&1 ||
  fail "the 8-rank run without eval"
[ "$(steps "$dir/plain8.log")" = "$(steps "$dir/2,2,1,1,2.log")" ] || fail "8 ranks: training records differ with eval"
cmp -s "$dir/plain8.safetensors" "$dir/2,2,1,1,2.safetensors" || fail "8 ranks: the checkpoint differs with eval"

# held-out text in microbatches, evaluated after the last step only
run --set data.source="text:$text" --set eval.source="text:$text" --set eval.batches=2 \
  --set optimizer.grad_accum_steps=2 --set mesh.shape=1,2,1,1,1 --set model.vocab_size=256 \
  >"$dir/text.log" 2>&1 || fail "text eval"
[ "$(evals "$dir/text.log" | cut -d' ' -f1)" = 4 ] || fail "text: one evaluation after step 4 expected"

# a relative --set eval.source=KIND:PATH is taken from the current directory, as for [data]
mkdir -p "$dir/cwd"
cp "$text" "$dir/cwd/held.txt"
(cd "$dir/cwd" && "$bin" run "$job" --no-peak --json --set job.steps=1 --set model.vocab_size=256 \
  --set eval.source=text:held.txt >"$dir/rel.log" 2>&1) || { cat "$dir/rel.log"; fail "relative eval.source"; }

# refused before any step, naming the key
expect() {
  want=$1 re=$2
  shift 2
  out=$("$@" 2>&1)
  code=$?
  if [ "$code" != "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$re" ||
    printf '%s\n' "$out" | grep -q '"grad_norm"'; then
    printf 'FAILED (exit %s, want %s, /%s/): %s\n%s\n' "$code" "$want" "$re" "$*" "$out"
    fails=$((fails + 1))
  fi
}
expect 2 "--set eval.every: is set but \[eval\] source is empty" run --set eval.every=10
expect 2 "--set eval.batches: is set but \[eval\] source is empty" run --set eval.batches=2
expect 2 "--set eval.source: evaluates during training only" \
  run --set job.mode=forward --set eval.source=synthetic
expect 2 "--set eval.source: $dir/none.txt: cannot open" run --set eval.source="text:$dir/none.txt"
expect 2 "--set eval.source: .*unknown data source 'bogus'" run --set eval.source=bogus
expect 2 "--set eval.batches: 0 is out of range" run --set eval.source=synthetic --set eval.batches=0
expect 2 "\[eval\] has no key 'evry'; did you mean 'every'" run --set eval.evry=2
expect 2 "plan.ini:[0-9]*: \[eval\] every: is set but \[eval\] source is empty" \
  sh -c "printf '[eval]\nevery = 5\n' | cat \"$job\" - >\"$dir/plan.ini\" && \"$bin\" plan \"$dir/plan.ini\""

[ $fails = 0 ] && echo "eval: ok"
