#!/bin/sh
# ckpt_reshard.sh TESSERA JOB OUT SRC_DIMS SRC_SHAPE [DIMS:SHAPE ...] [-- --set ...]: a sharded
# checkpoint ([checkpoint] dir) saved at step 3 of 5 under the mesh SRC_DIMS / SRC_SHAPE, resumed
# under each mesh DIMS:SHAPE (dims and shape ','-separated; "-" for one rank) with load = latest.
# Each resumed run must end (parameters and AdamW moments, the full-tensor export of step 5)
#   - bit for bit where the same mesh ends when it resumes from the full-tensor export of step 3
#     (the sharded load put every value where the export's does), and
#   - at rtol 1e-4 where the uninterrupted run of the saving mesh ends (tessera compare);
# the saving mesh resumed from its own sharded checkpoint ends bit for bit where it ends
# uninterrupted. Extra arguments after "--" go to every run (e.g. MoE keys).
set -u
bin=$1 job=$2 out=$3 sdims=$4 sshape=$5
shift 5
targets=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  targets="$targets $1"
  shift
done
[ $# -gt 0 ] && shift
rm -rf "$out"
mkdir -p "$out"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
run() { "$bin" run "$job" --no-peak --no-progress --set job.steps=5 "$@"; }
mesh() { # DIMS SHAPE: the --set pair ("-" is one rank)
  if [ "$1" = "-" ]; then echo "--set mesh.dims=dp --set mesh.shape=1"; else echo "--set mesh.dims=$1 --set mesh.shape=$2"; fi
}
src=$(mesh "$sdims" "$sshape")
# the saving mesh: uninterrupted to 5, and to 3 with the sharded checkpoint and the export
run $src "$@" --set checkpoint.save="$out/full5.safetensors" >"$out/full.log" 2>&1 ||
  { fail "uninterrupted run"; cat "$out/full.log"; }
run $src "$@" --stop-at 3 --set checkpoint.dir="$out/src" --set checkpoint.every=3 \
  --set checkpoint.save="$out/export3.safetensors" >"$out/src.log" 2>&1 ||
  { fail "saving run"; cat "$out/src.log"; }
[ -f "$out/src/step-000003/index.json" ] || fail "no step-000003 with its index"
grep "^checkpoint: step 3 saved" "$out/src.log"
# the saving mesh resumed from its own sharded checkpoint: bit for bit the uninterrupted run
cp -r "$out/src" "$out/same"
run $src "$@" --set checkpoint.dir="$out/same" --set checkpoint.load=latest \
  --set checkpoint.save="$out/same5.safetensors" >"$out/same.log" 2>&1 ||
  { fail "resume on the saving mesh"; cat "$out/same.log"; }
cmp -s "$out/same5.safetensors" "$out/full5.safetensors" &&
  cmp -s "$out/same5.optim.safetensors" "$out/full5.optim.safetensors" ||
  fail "the saving mesh resumed differs from its uninterrupted run"
i=0
for t in $targets; do
  i=$((i + 1))
  d=${t%%:*} s=${t#*:}
  dst=$(mesh "$d" "$s")
  cp -r "$out/src" "$out/t$i"
  run $dst "$@" --set checkpoint.dir="$out/t$i" --set checkpoint.load=latest \
    --set checkpoint.save="$out/t$i.safetensors" >"$out/t$i.log" 2>&1 ||
    { fail "$t: resume failed"; cat "$out/t$i.log"; continue; }
  grep -q "resumed from .* at step 3" "$out/t$i.log" || fail "$t: did not resume at step 3"
  grep "^checkpoint: loaded" "$out/t$i.log"
  run $dst "$@" --set checkpoint.load="$out/export3.safetensors" \
    --set checkpoint.save="$out/t$i.ref.safetensors" >"$out/t$i.ref.log" 2>&1 ||
    { fail "$t: resume from the export failed"; cat "$out/t$i.ref.log"; continue; }
  cmp -s "$out/t$i.safetensors" "$out/t$i.ref.safetensors" &&
    cmp -s "$out/t$i.optim.safetensors" "$out/t$i.ref.optim.safetensors" ||
    fail "$t: differs from the same mesh resumed from the full-tensor export"
  for f in "" .optim; do
    "$bin" compare "$out/t$i$f.safetensors" "$out/full5$f.safetensors" --rtol 1e-4 --atol 1e-6 \
      >"$out/t$i$f.cmp" 2>&1 || { fail "$t: $f differs from the uninterrupted run"; cat "$out/t$i$f.cmp"; }
  done
  [ -d "$out/t$i/step-000005" ] || fail "$t: no step-000005 saved after the resume"
  echo "$t: resumed bit for bit as from the export, within rtol 1e-4 of the uninterrupted run"
done
[ "$fails" = 0 ] && echo "ckpt reshard: ok"
