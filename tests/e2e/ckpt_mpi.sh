#!/bin/sh
# ckpt_mpi.sh TESSERA JOB OUT MPIRUN...: sharded checkpoints across backends. 4 mpi processes
# (FSDP, dp_shard 4) save at step 3 of 5, every process writing its own file; the checkpoint
# resumes on one local rank bit for bit as the full-tensor export of the same save resumes, and
# under 4 mpi processes with tp 4 as the local tp 4 run resumed from that export (rtol 1e-5: the
# backends sum in their own orders). A checkpoint saved by 8 local ranks (pp x dp x tp) resumes
# under 4 mpi processes (dp_replicate x dp_shard) likewise.
set -u
bin=$1 job=$2 out=$3
shift 3
rm -rf "$out"
mkdir -p "$out"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
flags="--no-peak --no-progress --set job.steps=5"
run() { "$bin" run "$job" $flags "$@"; }
mrun() { $mpirun -np 4 "$bin" run "$job" $flags --set job.backend=mpi "$@"; }
mpirun="$*"
# 4 mpi processes save
mrun --set mesh.dims=dp_shard --set mesh.shape=4 --stop-at 3 --set checkpoint.dir="$out/m" \
  --set checkpoint.every=3 --set checkpoint.save="$out/m3.safetensors" >"$out/m.log" 2>&1 ||
  { fail "mpi save"; cat "$out/m.log"; }
grep "^checkpoint: step 3" "$out/m.log"
n=$(ls "$out/m/step-000003" | grep -c '^rank-.*\.safetensors$')
[ "$n" = 4 ] || fail "the mpi save wrote $n rank files, not 4"
# one local rank resumes it, bit for bit as from the export
run --set mesh.dims=dp --set mesh.shape=1 --set checkpoint.load="$out/m/step-000003" \
  --set checkpoint.save="$out/one.safetensors" >"$out/one.log" 2>&1 || { fail "1-rank resume"; cat "$out/one.log"; }
run --set mesh.dims=dp --set mesh.shape=1 --set checkpoint.load="$out/m3.safetensors" \
  --set checkpoint.save="$out/one.ref.safetensors" >/dev/null 2>&1 || fail "1-rank resume from the export"
cmp -s "$out/one.safetensors" "$out/one.ref.safetensors" &&
  cmp -s "$out/one.optim.safetensors" "$out/one.ref.optim.safetensors" ||
  fail "1 rank: the sharded resume differs from the export's"
# 4 mpi processes on tp 4 resume it
cp -r "$out/m" "$out/mt"
mrun --set mesh.dims=tp --set mesh.shape=4 --set checkpoint.dir="$out/mt" --set checkpoint.load=latest \
  --set checkpoint.save="$out/tp.safetensors" >"$out/tp.log" 2>&1 || { fail "mpi tp 4 resume"; cat "$out/tp.log"; }
grep -q "resumed from .* at step 3" "$out/tp.log" || fail "mpi tp 4: did not resume at step 3"
run --set mesh.dims=tp --set mesh.shape=4 --set checkpoint.load="$out/m3.safetensors" \
  --set checkpoint.save="$out/tp.ref.safetensors" >/dev/null 2>&1 || fail "local tp 4 from the export"
for f in "" .optim; do
  "$bin" compare "$out/tp$f.safetensors" "$out/tp.ref$f.safetensors" --rtol 1e-5 --atol 1e-7 ||
    fail "mpi tp 4: $f differs from the local resume"
done
# 8 local ranks save, 4 mpi processes resume
run --set mesh.dims=pp,dp,tp --set mesh.shape=2,2,2 --stop-at 3 --set checkpoint.dir="$out/l" \
  --set checkpoint.save="$out/l3.safetensors" >/dev/null 2>&1 || fail "local save"
mrun --set mesh.dims=dp_replicate,dp_shard --set mesh.shape=2,2 --set checkpoint.dir="$out/l" \
  --set checkpoint.load=latest --set checkpoint.save="$out/h.safetensors" >"$out/h.log" 2>&1 ||
  { fail "mpi HSDP resume"; cat "$out/h.log"; }
run --set mesh.dims=dp_replicate,dp_shard --set mesh.shape=2,2 --set checkpoint.load="$out/l3.safetensors" \
  --set checkpoint.save="$out/h.ref.safetensors" >/dev/null 2>&1 || fail "local HSDP from the export"
for f in "" .optim; do
  "$bin" compare "$out/h$f.safetensors" "$out/h.ref$f.safetensors" --rtol 1e-5 --atol 1e-7 ||
    fail "mpi HSDP: $f differs from the local resume"
done
[ "$fails" = 0 ] && echo "ckpt mpi: ok"
