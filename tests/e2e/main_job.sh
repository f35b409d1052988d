#!/bin/sh
# main_job.sh TESSERA JOB.ini OUTDIR: the README's main job on its multi-dimensional mesh equals
# the same job on one rank: the first step's dump (logits, loss, gradients, parameters after
# AdamW) at rtol/atol 1e-4, and the loss of each of the first 5 steps to 1e-4 relative.
set -eu
bin=$1 job=$2 dir=$3
mkdir -p "$dir"
ones=$(sed -n 's/^shape *= *//p' "$job" | sed 's/[0-9][0-9]*/1/g' | tr -d ' ')
"$bin" run "$job" --no-peak --stop-at 5 --json --dump "$dir/mesh.safetensors" >"$dir/mesh.json"
"$bin" run "$job" --no-peak --stop-at 5 --json --set "mesh.shape=$ones" \
  --dump "$dir/one.safetensors" >"$dir/one.json"
"$bin" compare "$dir/mesh.safetensors" "$dir/one.safetensors" --rtol 1e-4 --atol 1e-4
losses() { sed -n 's/.*"loss": \([-0-9.e]*\),.*/\1/p' "$1"; }
losses "$dir/mesh.json" >"$dir/mesh.loss"
losses "$dir/one.json" >"$dir/one.loss"
[ "$(wc -l <"$dir/mesh.loss")" -eq 5 ] || { echo "expected 5 losses"; cat "$dir/mesh.json"; exit 1; }
paste "$dir/mesh.loss" "$dir/one.loss" | awk '
  { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2);
    printf "step %d: mesh %s  1 rank %s  rel %.2e\n", NR, $1, $2, r; if (r > 1e-4) bad = 1 }
  END { exit bad }'
echo "main job: mesh == 1 rank"
