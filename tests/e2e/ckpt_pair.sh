#!/bin/sh
# ckpt_pair.sh TESSERA JOB DIR: a checkpoint's two files are one unit.
#  1. the optimizer file of one save beside the model file of another is refused (exit 2), naming
#     both files and both steps, where it used to resume on the wrong weights;
#  2. a save killed between its two renames (new optimizer file, old model file, the new model
#     file complete under its temporary name) resumes exactly as the whole checkpoint would, and
#     the next save to that name removes the dead writer's temporary.
set -eu
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
run() { "$bin" run "$job" --no-peak --no-progress "$@"; }
run --stop-at 2 --set checkpoint.save="$dir/a.safetensors" >/dev/null
run --stop-at 4 --set checkpoint.save="$dir/b.safetensors" >/dev/null

cp "$dir/a.safetensors" "$dir/mixed.safetensors"
cp "$dir/b.optim.safetensors" "$dir/mixed.optim.safetensors"
code=0
run --stop-at 6 --set checkpoint.load="$dir/mixed.safetensors" >"$dir/mixed.log" 2>&1 || code=$?
if [ "$code" != 2 ]; then
  cat "$dir/mixed.log"
  echo "ckpt pair: a mixed pair gave exit $code, not 2"
  exit 1
fi
grep -q -- "--set checkpoint.load: .*mixed.safetensors (step 2, .*mixed.optim.safetensors (step 4, .*not one checkpoint" \
  "$dir/mixed.log" || { cat "$dir/mixed.log"; echo "ckpt pair: message"; exit 1; }

# a writer that is gone: a reaped child's pid
true &
dead=$!
wait "$dead"
cp "$dir/a.safetensors" "$dir/cut.safetensors"
cp "$dir/b.optim.safetensors" "$dir/cut.optim.safetensors"
cp "$dir/b.safetensors" "$dir/cut.safetensors.tmp.$dead.0badf00d"
run --stop-at 6 --set checkpoint.load="$dir/cut.safetensors" --set checkpoint.save="$dir/cut.safetensors" \
  >"$dir/cut.log"
grep -q "resumed from .* at step 4" "$dir/cut.log" || { cat "$dir/cut.log"; exit 1; }
grep -q "loading its complete model file .*cut.safetensors.tmp.$dead.0badf00d" "$dir/cut.log"
[ ! -e "$dir/cut.safetensors.tmp.$dead.0badf00d" ] || { echo "ckpt pair: stale temporary kept"; exit 1; }
# the first save to a name killed the same way: no model file yet, only its temporary
cp "$dir/b.optim.safetensors" "$dir/first.optim.safetensors"
cp "$dir/b.safetensors" "$dir/first.safetensors.tmp.$dead.0badf00d"
run --stop-at 6 --set checkpoint.load="$dir/first.safetensors" >"$dir/first.log"
grep -q "resumed from .* at step 4" "$dir/first.log" || { cat "$dir/first.log"; exit 1; }
run --stop-at 6 --set checkpoint.load="$dir/b.safetensors" --set checkpoint.save="$dir/whole.safetensors" \
  >/dev/null
cmp "$dir/whole.safetensors" "$dir/cut.safetensors"
cmp "$dir/whole.optim.safetensors" "$dir/cut.optim.safetensors"
echo "ckpt pair: ok"
