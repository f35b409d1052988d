#!/bin/sh
# ckpt_export.sh TESSERA JOB OUT: `tessera export` of a sharded checkpoint folder. A run saves at
# step 3 both a sharded checkpoint ([checkpoint] dir) and the full-tensor file; exporting the
# folder (--checkpoint DIR/step-000003, and [checkpoint] load = latest) writes the same Hugging
# Face folder byte for byte as exporting the full-tensor file: under pp 2 x dp 2 x tp 2, and with
# MoE layers sharded over ep 2 (the per-expert tensors come out of the stacked experts). A folder
# of another model is refused (exit 2) naming the tensor and both shapes.
set -u
bin=$1 job=$2 out=$3
rm -rf "$out"
mkdir -p "$out"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
# case NAME --set ...: save both ways, export both, compare every file of the two folders
case_() {
  name=$1
  shift
  d="$out/$name"
  "$bin" run "$job" --no-peak --no-progress --set job.steps=3 "$@" --set checkpoint.dir="$d.ck" \
    --set checkpoint.save="$d.full.safetensors" >"$d.log" 2>&1 || { fail "$name: run"; cat "$d.log"; }
  "$bin" export "$job" "$d.from_full" "$@" --checkpoint "$d.full.safetensors" >"$d.e1.log" 2>&1 ||
    { fail "$name: export of the full-tensor file"; cat "$d.e1.log"; }
  "$bin" export "$job" "$d.from_folder" "$@" --checkpoint "$d.ck/step-000003" >"$d.e2.log" 2>&1 ||
    { fail "$name: export of the sharded folder"; cat "$d.e2.log"; }
  "$bin" export "$job" "$d.from_latest" "$@" --set checkpoint.dir="$d.ck" \
    --set checkpoint.load=latest >"$d.e3.log" 2>&1 || { fail "$name: export of latest"; cat "$d.e3.log"; }
  grep -q "exported .*step-000003" "$d.e3.log" || fail "$name: latest did not export step-000003"
  files=$(cd "$d.from_full" && ls | tr '\n' ' ')
  [ -n "$files" ] || fail "$name: nothing exported"
  for f in $files; do
    cmp -s "$d.from_full/$f" "$d.from_folder/$f" || fail "$name: $f differs (--checkpoint folder)"
    cmp -s "$d.from_full/$f" "$d.from_latest/$f" || fail "$name: $f differs (load = latest)"
  done
  [ "$(cd "$d.from_folder" && ls | tr '\n' ' ')" = "$files" ] || fail "$name: other files"
}
case_ 3d --set mesh.dims=pp,dp,tp --set mesh.shape=2,2,2
case_ moe --set plugins.load=dp,tp,pp,cp_ring,cp_ulysses,ep --set model.num_local_experts=4 \
  --set model.num_experts_per_tok=2 --set mesh.dims=ep --set mesh.shape=2
# another model's folder
"$bin" export "$job" "$out/bad" --set model.intermediate_size=64 \
  --checkpoint "$out/3d.ck/step-000003" >"$out/bad.log" 2>&1
code=$?
{ [ "$code" = 2 ] && grep -q "step-000003: tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[48, 32\], the job's model needs \[64, 32\]" "$out/bad.log"; } ||
  { fail "another model's folder (exit $code)"; cat "$out/bad.log"; }
[ -e "$out/bad" ] && fail "a refused export wrote its folder"
[ "$fails" = 0 ] && echo "ckpt export: ok"
