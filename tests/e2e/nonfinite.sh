#!/bin/sh
# nonfinite.sh TESSERA JOB DIR: a run that goes non-finite stops with exit 1 naming the step and
# writes no checkpoint over the good one; a checkpoint holding NaN is refused at load naming the
# tensor; [optimizer] eps = 0 is refused before any step.
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
run() { "$bin" run "$job" --no-peak --no-progress "$@"; }
run --set checkpoint.save="$dir/good.safetensors" >/dev/null || exit 1
cp "$dir/good.safetensors" "$dir/good.copy"
cp "$dir/good.optim.safetensors" "$dir/good.optim.copy"
# The same tensors with every data byte replaced: 0x7e7e7e7e is 8.4e37 (finite, and the
# activations overflow), 0xffffffff is NaN.
hlen=$(od -An -tu8 -N8 "$dir/good.safetensors" | tr -d ' ')
size=$(wc -c <"$dir/good.safetensors")
patch() {
  head -c $((8 + hlen)) "$dir/good.safetensors" >"$2"
  head -c $((size - 8 - hlen)) /dev/zero | tr '\0' "$1" >>"$2"
}
patch '\176' "$dir/huge.safetensors"
patch '\377' "$dir/nan.safetensors"

out=$(run --set checkpoint.load="$dir/huge.safetensors" --set checkpoint.save="$dir/good.safetensors" 2>&1)
code=$?
echo "$out" | grep -q "rank 0: step 1: the \(loss\|gradient norm\) is \(NaN\|Inf\) on rows 0-[0-9]* of the step.s batch.*: the run diverged" && [ "$code" = 1 ] ||
  { echo "$out"; echo "nonfinite: a diverged run gave exit $code"; exit 1; }
cmp "$dir/good.safetensors" "$dir/good.copy" && cmp "$dir/good.optim.safetensors" "$dir/good.optim.copy" ||
  { echo "nonfinite: the good checkpoint was replaced"; exit 1; }

out=$(run --set checkpoint.load="$dir/nan.safetensors" 2>&1)
code=$?
echo "$out" | grep -q -- "--set checkpoint.load: .*nan.safetensors: tensor '[a-z_.0-9]*' holds NaN at element 0" &&
  [ "$code" = 2 ] || { echo "$out"; echo "nonfinite: a NaN checkpoint gave exit $code"; exit 1; }

out=$(run --set optimizer.eps=0 2>&1)
code=$?
echo "$out" | grep -q -- "--set optimizer.eps: 0 is out of range" && [ "$code" = 2 ] &&
  ! echo "$out" | grep -q "^step " || { echo "$out"; echo "nonfinite: eps = 0 gave exit $code"; exit 1; }
echo "nonfinite: ok"
