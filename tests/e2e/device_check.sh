#!/bin/sh
# device_check.sh TESSERA EXAMPLES GOLDEN DIR: jobs on a device against the same jobs on the CPU:
# the dump of 2 steps of a job of every strategy (dp, FSDP, HSDP, tp, tp + sp, pp, ring and
# Ulysses context parallelism, the main job's dp x tp x pp), and a checkpoint saved on one device
# and resumed on the other. The golden case runs on it too.
#
# DEVICE=emu (default; ctest): the emulated device, memory the host cannot touch behind the CPU's
# kernels, so every comparison is exact (RTOL = ATOL = 0). DEVICE=cuda (bench/gpu_check.sh): the
# GPU, compared at RTOL / ATOL, which the caller sets from the GPU's rounding (TF32 GEMMs).
set -eu
bin=$1 ex=$2 golden=$3 dir=$4
dev=${DEVICE:-emu} rtol=${RTOL:-0} atol=${ATOL:-0}
mkdir -p "$dir"
rm -f "$dir"/*.safetensors
for job in single dp_fsdp dp_hsdp_notp pp_zero_bubble pp_interleaved tp tp_sp cp_ring cp_ulysses \
  cp_hybrid llama-tiny llama-tiny_bf16 llama-tiny_tied; do
  ini="$ex/$job.ini" extra=""
  if [ "$job" = dp_hsdp_notp ]; then
    # HSDP without tp: dp_replicate 2 x dp_shard 2
    ini="$ex/dp_hsdp.ini" extra="--set mesh.shape=2,2,1"
  elif [ "$job" = llama-tiny_tied ]; then
    # tied embeddings over pp stages: the replica's gradient is clipped apart from the others
    ini="$ex/llama-tiny.ini" extra="--set model.tie_word_embeddings=true"
  elif [ "$job" = llama-tiny_bf16 ]; then
    # the main job in mixed precision: the bf16 GEMMs of the device
    ini="$ex/llama-tiny.ini" extra="--set job.dtype=bf16"
  fi
  for d in cpu "$dev"; do
    # shellcheck disable=SC2086 # extra is empty or one --set pair
    "$bin" run "$ini" --no-peak --no-progress --set job.steps=2 --set job.device=$d $extra \
      --dump "$dir/$job.$d.safetensors" >/dev/null
  done
  "$bin" compare "$dir/$job.$dev.safetensors" "$dir/$job.cpu.safetensors" --rtol "$rtol" \
    --atol "$atol" | grep -q "MATCH: 0 tensors" || { echo "$job: $dev differs from cpu"; exit 1; }
  echo "$job: $dev matches cpu at rtol $rtol, atol $atol"
done

# a checkpoint saved on either device resumes on either, equal to CPU to CPU (the dump is the
# first step after the resume)
fsdp="$ex/dp_fsdp.ini"
for from in cpu "$dev"; do
  "$bin" run "$fsdp" --no-peak --no-progress --set job.steps=4 --set job.device=$from --stop-at 2 \
    --set checkpoint.save="$dir/half.$from.safetensors" >/dev/null
  for to in cpu "$dev"; do
    "$bin" run "$fsdp" --no-peak --no-progress --set job.steps=4 --set job.device=$to \
      --set checkpoint.load="$dir/half.$from.safetensors" \
      --dump "$dir/resumed.$from.$to.safetensors" >/dev/null
  done
done
for pair in "cpu.$dev" "$dev.cpu" "$dev.$dev"; do
  "$bin" compare "$dir/resumed.$pair.safetensors" "$dir/resumed.cpu.cpu.safetensors" \
    --rtol "$rtol" --atol "$atol" | grep -q "MATCH: 0 tensors" ||
    { echo "checkpoint $pair: differs"; exit 1; }
  echo "checkpoint saved on ${pair%.*}, resumed on ${pair#*.}: matches cpu -> cpu"
done

# the golden case at the golden tolerance (or the device's, when looser)
grtol=1e-4 gatol=1e-5
[ "$dev" = emu ] || grtol=$rtol gatol=$atol
"$bin" run "$golden/gqa/job.ini" --no-peak --no-progress --set job.device="$dev" \
  --dump "$dir/golden_gqa.safetensors" >/dev/null
"$bin" compare "$dir/golden_gqa.safetensors" "$golden/gqa/expected.safetensors" --rtol "$grtol" \
  --atol "$gatol" | grep -q "MATCH: 0 tensors" || { echo "golden gqa on $dev differs"; exit 1; }
echo "golden gqa on $dev: match at rtol $grtol, atol $gatol"
