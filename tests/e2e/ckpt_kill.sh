#!/bin/sh
# ckpt_kill.sh TESSERA JOB DIR: a real `tessera run` killed (SIGKILL) at each point of a
# checkpoint save over a good checkpoint (TESSERA_TEST_SAVE_KILL, core/io_internal.h) leaves
# files from which the next run resumes the last complete checkpoint: the old one while the new
# optimizer file is unpublished, the new one from the commit point (the optimizer file) on. The
# resumed runs end bit for bit where uninterrupted runs from those checkpoints end, the next save
# removes the dead writer's temporaries, and the mixed pair a lost temporary would leave (new
# optimizer file, old model file) is refused, never resumed.
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
run() { "$bin" run "$job" --no-peak --no-progress "$@"; }
# the good checkpoint at step 2, the complete one at step 4, and where each ends at step 6
run --stop-at 2 --set checkpoint.save="$dir/good.safetensors" >/dev/null || fail "step 2"
run --stop-at 4 --set checkpoint.save="$dir/four.safetensors" >/dev/null || fail "step 4"
for s in good four; do
  run --stop-at 6 --set checkpoint.load="$dir/$s.safetensors" \
    --set checkpoint.save="$dir/$s-6.safetensors" >/dev/null || fail "$s to step 6"
done

for point in optim-half optim-temp model-half model-temp optim-published published; do
  ck="$dir/$point.safetensors"
  cp "$dir/good.safetensors" "$ck"
  cp "$dir/good.optim.safetensors" "$dir/$point.optim.safetensors"
  # from step 2 to 4, saving over the checkpoint it loaded, killed at the point
  TESSERA_TEST_SAVE_KILL=$point run --stop-at 4 --set checkpoint.load="$ck" \
    --set checkpoint.save="$ck" >"$dir/$point.kill.log" 2>&1
  code=$?
  [ "$code" = 137 ] || fail "$point: the run was not killed (exit $code)"
  case $point in
    optim-published | published) from=4 ref=four ;;
    *) from=2 ref=good ;;
  esac
  if [ "$point" = optim-published ]; then
    # the new optimizer file beside the old model file, its temporary lost: refused
    mkdir -p "$dir/lost"
    cp "$ck" "$dir/lost/x.safetensors"
    cp "$dir/$point.optim.safetensors" "$dir/lost/x.optim.safetensors"
    run --stop-at 6 --set checkpoint.load="$dir/lost/x.safetensors" >"$dir/lost.log" 2>&1
    code=$?
    { [ "$code" = 2 ] && grep -q "not one checkpoint" "$dir/lost.log"; } ||
      { fail "a mixed pair was not refused (exit $code)"; cat "$dir/lost.log"; }
  fi
  # the next run resumes the last complete checkpoint and saves over it
  run --stop-at 6 --set checkpoint.load="$ck" --set checkpoint.save="$ck" >"$dir/$point.log" 2>&1 ||
    { fail "$point: resume failed"; cat "$dir/$point.log"; continue; }
  grep -q "resumed from .* at step $from" "$dir/$point.log" ||
    { fail "$point: did not resume at step $from"; cat "$dir/$point.log"; }
  cmp -s "$ck" "$dir/$ref-6.safetensors" && cmp -s "$dir/$point.optim.safetensors" "$dir/$ref-6.optim.safetensors" ||
    fail "$point: step 6 differs from the uninterrupted run from step $from"
  left=$(ls "$dir" | grep -c "^$point\(\.optim\)*\.safetensors\.tmp\.")
  [ "$left" = 0 ] || fail "$point: $left temporaries left after the next save"
done
[ "$fails" = 0 ] && echo "ckpt kill: ok"
