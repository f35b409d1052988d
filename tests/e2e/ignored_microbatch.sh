#!/bin/sh
# ignored_microbatch.sh TESSERA JOB DIR: with grad_accum_steps = 2, a microbatch whose labels
# are all -100 weighs nothing: the step's loss is finite and the run goes on (it logged
# "loss nan", and a non-finite loss now stops a run).
set -eu
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
# 4 rows of 16 tokens: input ids 1; labels -100 in rows 0-1 (the first microbatch), 1 after
hdr='{"input_ids":{"dtype":"I32","shape":[4,16],"data_offsets":[0,256]},"labels":{"dtype":"I32","shape":[4,16],"data_offsets":[256,512]}}'
while [ $((${#hdr} % 8)) != 0 ]; do hdr="$hdr "; done
f="$dir/batch.safetensors"
printf "\\$(printf %03o ${#hdr})\\000\\000\\000\\000\\000\\000\\000" >"$f"
printf '%s' "$hdr" >>"$f"
i=0
while [ $i -lt 64 ]; do printf '\001\000\000\000' >>"$f"; i=$((i + 1)); done
i=0
while [ $i -lt 32 ]; do printf '\234\377\377\377' >>"$f"; i=$((i + 1)); done
i=0
while [ $i -lt 32 ]; do printf '\001\000\000\000' >>"$f"; i=$((i + 1)); done
"$bin" run "$job" --no-peak --no-progress --set job.steps=2 --set optimizer.grad_accum_steps=2 \
  --set data.source="safetensors:$f" >"$dir/log"
cat "$dir/log"
! grep -q "loss nan" "$dir/log"
grep -q "^step   2/2  loss [0-9]" "$dir/log"
echo "ignored microbatch: ok"
