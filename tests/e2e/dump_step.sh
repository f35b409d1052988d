#!/bin/sh
# dump_step.sh TESSERA MATRIX_JOB DIR: --dump-step K dumps optimizer step K (logits, loss,
# gradients, parameters after the update) of a longer run, equal bit for bit to the dump of a
# run stopped at K - 1 and resumed (whose first step is K) and to a run that stops at K, on 1
# rank and on pp x dp x tp; without it the dump is of the run's first step (step 1, or the step
# after the checkpoint); steps the run does not take, a missing dump path and bad values are
# refused before any step.
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
run() { "$bin" run "$job" --no-peak --no-progress --set job.steps=5 "$@"; }
same() { # same A B: every tensor equal, bit for bit
  "$bin" compare "$1" "$2" --rtol 0 --atol 0 >"$dir/cmp.txt" 2>&1 && grep -q "MATCH: 0 tensors" "$dir/cmp.txt"
}

for shape in 1,1,1,1,1 2,2,1,1,2; do
  m="--set mesh.shape=$shape"
  # shellcheck disable=SC2086
  {
    run $m --dump-step 3 --dump "$dir/k.$shape" >/dev/null 2>&1 || fail "$shape: --dump-step 3"
    run $m --stop-at 3 --dump-step 3 --dump "$dir/stop.$shape" >/dev/null 2>&1 || fail "$shape: stop at 3"
    run $m --stop-at 2 --set checkpoint.save="$dir/c.$shape.safetensors" >/dev/null 2>&1 || fail "$shape: stop at 2"
    run $m --set checkpoint.load="$dir/c.$shape.safetensors" --stop-at 3 --dump "$dir/resumed.$shape" \
      >/dev/null 2>&1 || fail "$shape: resumed"
    run $m --dump "$dir/first.$shape" >/dev/null 2>&1 || fail "$shape: default dump"
    run $m --stop-at 1 --dump "$dir/one.$shape" >/dev/null 2>&1 || fail "$shape: stop at 1"
  }
  same "$dir/k.$shape" "$dir/resumed.$shape" || { cat "$dir/cmp.txt"; fail "$shape: step 3 differs from the resumed run's"; }
  same "$dir/k.$shape" "$dir/stop.$shape" || { cat "$dir/cmp.txt"; fail "$shape: step 3 differs from the run stopped at 3"; }
  same "$dir/first.$shape" "$dir/one.$shape" || fail "$shape: the default dump is not step 1"
  same "$dir/k.$shape" "$dir/first.$shape" && fail "$shape: step 3's dump equals step 1's"
done

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
expect 2 "--dump-step 6 is past the run's last step, 5 (\[job\] steps)" run --dump-step 6 --dump "$dir/x"
expect 2 "--dump-step 4 is past the run's last step, 3 (--stop-at)" run --stop-at 3 --dump-step 4 --dump "$dir/x"
expect 2 "--dump-step 2: there is no dump to write" run --dump-step 2
expect 2 "--dump-step 2: the run resumes after step 2" \
  run --set checkpoint.load="$dir/c.1,1,1,1,1.safetensors" --dump-step 2 --dump "$dir/x"
expect 2 "--dump-step '0': expected a step number >= 1" run --dump-step 0 --dump "$dir/x"
expect 2 "--dump-step 'x': expected a step number >= 1" run --dump-step x --dump "$dir/x"
expect 2 "--dump-step needs a value" run --dump-step
[ -e "$dir/x" ] && fail "a refused run wrote a dump"

[ $fails = 0 ] && echo "dump step: ok"
