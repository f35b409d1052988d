#!/bin/sh
# device_emu.sh TESSERA EXAMPLES GOLDEN DIR: jobs on the emulated device (device = emu: memory
# the host cannot touch, the CPU's kernels) against the same jobs on the CPU, bit for bit: the
# dump of 2 steps, and a checkpoint saved on one device and resumed on the other. The golden
# case runs on it too. A plugin that keeps to host memory refuses the device with the fix.
set -eu
bin=$1 ex=$2 golden=$3 dir=$4
mkdir -p "$dir"
rm -f "$dir"/*.safetensors
for job in single dp_fsdp dp_hsdp_notp pp_zero_bubble pp_interleaved; do
  ini="$ex/$job.ini" extra=""
  if [ "$job" = dp_hsdp_notp ]; then
    # HSDP without tp: dp_replicate 2 x dp_shard 2
    ini="$ex/dp_hsdp.ini" extra="--set mesh.shape=2,2,1"
  fi
  for dev in cpu emu; do
    # shellcheck disable=SC2086 # extra is empty or one --set pair
    "$bin" run "$ini" --no-peak --no-progress --set job.steps=2 --set job.device=$dev $extra \
      --dump "$dir/$job.$dev.safetensors" >/dev/null
  done
  "$bin" compare "$dir/$job.emu.safetensors" "$dir/$job.cpu.safetensors" --rtol 0 --atol 0 |
    grep -q "MATCH: 0 tensors" || { echo "$job: emu differs from cpu"; exit 1; }
  echo "$job: emu == cpu"
done

# a checkpoint saved on either device resumes on either, equal to CPU to CPU (the dump is the
# first step after the resume)
fsdp="$ex/dp_fsdp.ini"
for from in cpu emu; do
  "$bin" run "$fsdp" --no-peak --no-progress --set job.steps=4 --set job.device=$from --stop-at 2 \
    --set checkpoint.save="$dir/half.$from.safetensors" >/dev/null
  for to in cpu emu; do
    "$bin" run "$fsdp" --no-peak --no-progress --set job.steps=4 --set job.device=$to \
      --set checkpoint.load="$dir/half.$from.safetensors" \
      --dump "$dir/resumed.$from.$to.safetensors" >/dev/null
  done
done
for pair in cpu.emu emu.cpu emu.emu; do
  "$bin" compare "$dir/resumed.$pair.safetensors" "$dir/resumed.cpu.cpu.safetensors" --rtol 0 \
    --atol 0 | grep -q "MATCH: 0 tensors" || { echo "checkpoint $pair: differs"; exit 1; }
  echo "checkpoint saved on ${pair%.*}, resumed on ${pair#*.}: equal to cpu -> cpu"
done

"$bin" run "$golden/gqa/job.ini" --no-peak --no-progress --set job.device=emu \
  --dump "$dir/golden_gqa.safetensors" >/dev/null
"$bin" compare "$dir/golden_gqa.safetensors" "$golden/gqa/expected.safetensors" --rtol 1e-4 \
  --atol 1e-5 | grep -q "MATCH: 0 tensors" || { echo "golden gqa on emu differs"; exit 1; }
echo "golden gqa on emu: match"

if "$bin" run "$ex/tp.ini" --no-peak --no-progress --set job.device=emu >"$dir/tp.log" 2>&1; then
  echo "tp ran on emu without refusing"
  exit 1
fi
grep -q "plugin tp .* device = cpu only" "$dir/tp.log" || { cat "$dir/tp.log"; exit 1; }
echo "tp on emu: refused"
