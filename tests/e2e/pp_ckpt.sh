#!/bin/sh
# Checkpoint save under pp > 1 writes every stage's parameters and optimizer state: one step of
# JOB saved, against the same step of the 1-rank REF saved; then that checkpoint loaded on one
# rank (REF, forward mode) gives the logits JOB's pipeline gives with it loaded.
# usage: pp_ckpt.sh TESSERA JOB REF OUTDIR
set -e
bin=$1 job=$2 ref=$3 out=$4
name=$(basename "$job" .ini)
mkdir -p "$out"
"$bin" run "$job" --no-peak --set checkpoint.save="$out/$name.safetensors" >/dev/null
"$bin" run "$ref" --no-peak --set checkpoint.save="$out/${name}_ref.safetensors" >/dev/null
"$bin" compare "$out/$name.safetensors" "$out/${name}_ref.safetensors" --rtol 1e-5 --atol 1e-6
"$bin" compare "$out/$name.optim.safetensors" "$out/${name}_ref.optim.safetensors" --rtol 1e-5 \
  --atol 1e-6
for which in "$job" "$ref"; do
  "$bin" run "$which" --no-peak --set job.mode=forward --set checkpoint.load="$out/$name.safetensors" \
    --dump "$out/$(basename "$which" .ini).fwd.safetensors" >/dev/null
done
"$bin" compare "$out/$name.fwd.safetensors" "$out/$(basename "$ref" .ini).fwd.safetensors" \
  --rtol 1e-5 --atol 1e-6
