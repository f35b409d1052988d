#!/bin/sh
# mesh_matrix.sh TESSERA JOB.ini OUTDIR: runs one training step of JOB under every mesh of up to
# 16 ranks built from pp, dp, ring_cp, ulysses_cp and tp with sizes 1 or 2, plus meshes with
# sizes 3 and 4, the FSDP / HSDP dims and sequence parallelism, and compares each first-step dump (logits, loss,
# gradients, parameters after AdamW) with the 1-rank run at rtol = atol = 1e-4.
#
# DEVICE=emu|cuda runs every mesh on that device, all ranks on one device as virtual ranks (the
# 1-rank reference stays on the CPU), compared at RTOL / ATOL (default 1e-4; the caller sets the
# device's, e.g. TF32's on a GPU).
#
# DTYPE=bf16 runs the matrix and its 1-rank reference in mixed precision ([job] dtype = bf16).
# Elementwise tolerances do not fit it: a sum taken in another order can round a GEMM operand to
# the neighbouring bf16 value, one step of 2^-8, and AdamW's first step turns the sign of a
# near-zero gradient into 2 lr. So each tensor is compared by its relative L2 error: logits, loss
# and gradients within 2e-3, everything (the updated parameters too) within 6e-3. Measured on
# this matrix: at most 7.6e-4 and 3.1e-3; the f32 run against the bf16 one: 5.7e-3 and 9.3e-3,
# and the matrix checks that the f32 run fails, so the comparison tells the modes apart.
#
# MOE=1 makes layers 1 and 3 of the model Mixtral MoE layers (4 experts, top-2) and adds the
# meshes with the expert-parallel dim ep. The load-balancing loss is off (router_aux_loss_coef =
# 0): the pipeline meshes refuse it (docs/moe.md); the e2e_*moe* tests check it on the others.
#
# A mesh the model cannot be split over is skipped with the reason printed, but only when
# `tessera run` refuses it at plan time (exit 2) with one of the messages in SPLIT_REFUSALS;
# any other failure fails the matrix.
set -u
bin=$1 job=$2 dir=$3
dev=${DEVICE:-cpu} rtol=${RTOL:-1e-4} atol=${ATOL:-1e-4} dtype=${DTYPE:-f32} moe=${MOE:-0}
extra= # options every run gets (no spaces inside one)
[ "$moe" = 1 ] && extra="--set model.num_local_experts=4 --set model.num_experts_per_tok=2
  --set model.decoder_sparse_step=2 --set model.router_aux_loss_coef=0"
mkdir -p "$dir"
SPLIT_REFUSALS='cannot be split|does not divide|not divisible|at least one|leaves rank'
dims5=pp,dp,ring_cp,ulysses_cp,tp

"$bin" run "$job" --no-peak --set "job.dtype=$dtype" $extra --dump "$dir/one.safetensors" \
  >"$dir/one.log" 2>&1 || { cat "$dir/one.log"; echo "the 1-rank run failed"; exit 1; }

# compare_one A: A against the 1-rank run, as the dtype asks; the report goes to stdout.
compare_one() {
  if [ "$dtype" = bf16 ]; then
    "$bin" compare "$1" "$dir/one.safetensors" --rel-l2 2e-3 --skip after. &&
      "$bin" compare "$1" "$dir/one.safetensors" --rel-l2 6e-3
  else
    "$bin" compare "$1" "$dir/one.safetensors" --rtol "$rtol" --atol "$atol"
  fi
}

if [ "$dtype" = bf16 ]; then
  "$bin" run "$job" --no-peak --set job.dtype=f32 --dump "$dir/one_f32.safetensors" \
    >"$dir/one_f32.log" 2>&1 || { cat "$dir/one_f32.log"; echo "the f32 run failed"; exit 1; }
  if compare_one "$dir/one_f32.safetensors" >"$dir/one_f32.cmp" 2>&1; then
    echo "FAIL: the f32 run passes the bf16 comparison, which therefore cannot see the dtype"
    exit 1
  fi
fi

pass=0 skip=0 fail=0
check() { # check DIMS SHAPE [PLUGINS]
  name=$(echo "$1=$2${3:+=$3}" | tr ',' '_')
  out="$dir/$name"
  "$bin" run "$job" --no-peak --set "job.device=$dev" --set "job.dtype=$dtype" \
    --set "mesh.dims=$1" --set "mesh.shape=$2" ${3:+--set "plugins.load=$3"} $extra \
    --dump "$out.safetensors" >"$out.log" 2>&1
  rc=$?
  if [ $rc -eq 2 ] && grep -Eq "$SPLIT_REFUSALS" "$out.log"; then
    skip=$((skip + 1))
    echo "SKIP $1 = $2${3:+ with $3}: $(grep -E "$SPLIT_REFUSALS" "$out.log" | head -1)"
  elif [ $rc -ne 0 ]; then
    fail=$((fail + 1))
    echo "FAIL $1 = $2${3:+ with $3}: exit $rc"
    sed 's/^/    /' "$out.log" | tail -5
  elif compare_one "$out.safetensors" >"$out.cmp" 2>&1; then
    pass=$((pass + 1))
    echo "PASS $1 = $2${3:+ with $3}: $(grep '^max' "$out.cmp" | tail -1 | sed 's/, max rel.*//')"
  else
    fail=$((fail + 1))
    echo "FAIL $1 = $2${3:+ with $3}: differs from the 1-rank run"
    sed 's/^/    /' "$out.cmp" | tail -5
  fi
}

# sizes 1 or 2 on each of the five dims: every combination of at most 16 ranks
for pp in 1 2; do for dp in 1 2; do for ring in 1 2; do for uly in 1 2; do for tp in 1 2; do
  world=$((pp * dp * ring * uly * tp))
  [ $world -gt 1 ] && [ $world -le 16 ] && check $dims5 "$pp,$dp,$ring,$uly,$tp"
done; done; done; done; done
# sizes 3 and 4
for shape in 1,1,1,1,4 1,1,1,1,3 4,1,1,1,1 3,1,1,1,1 1,4,1,1,1 1,3,1,1,1 1,1,4,1,1 1,1,1,4,1 \
  2,2,1,1,4 1,1,2,4,1 1,1,1,2,4; do
  check $dims5 $shape
done
# FSDP (dp_shard) and HSDP (dp_replicate x dp_shard)
check pp,dp_shard,ring_cp,ulysses_cp,tp 1,2,1,1,1
check pp,dp_shard,ring_cp,ulysses_cp,tp 1,4,1,1,1
check pp,dp_shard,ring_cp,ulysses_cp,tp 1,2,1,1,2
check pp,dp_shard,ring_cp,ulysses_cp,tp 2,2,1,1,1
check pp,dp_shard,ring_cp,ulysses_cp,tp 1,2,2,2,1
check pp,dp_shard,ring_cp,ulysses_cp,tp 2,2,2,1,2
check pp,dp_replicate,dp_shard,ring_cp,ulysses_cp,tp 1,2,2,1,1,1
check pp,dp_replicate,dp_shard,ring_cp,ulysses_cp,tp 1,2,2,1,1,2
# sequence parallelism inside tp
with_sp=dp,tp,sp,pp,cp_ring,cp_ulysses
check $dims5 1,1,1,1,2 $with_sp
check $dims5 1,2,1,1,2 $with_sp
check $dims5 2,1,2,1,2 $with_sp
check $dims5 1,1,1,2,2 $with_sp

# expert parallelism: ep alone, and beside each of the other dims
if [ "$moe" = 1 ]; then
  with_ep=dp,tp,pp,cp_ring,cp_ulysses,ep
  dims6=pp,dp,ring_cp,ulysses_cp,tp,ep
  for shape in 1,1,1,1,1,2 1,1,1,1,1,4 1,2,1,1,1,2 1,1,1,1,2,2 2,1,1,1,1,2 1,1,2,1,1,2 \
    1,1,1,2,1,2 2,2,1,1,1,2 1,2,1,1,2,2 2,1,2,1,2,2; do
    check $dims6 $shape $with_ep
  done
  check pp,dp_shard,ring_cp,ulysses_cp,tp,ep 1,2,1,1,1,2 $with_ep
  check $dims6 1,1,1,1,2,2 dp,tp,sp,pp,cp_ring,cp_ulysses,ep
fi

echo "mesh matrix on $dev in $dtype${extra:+ with MoE}: $pass passed, $skip skipped, $fail failed"
[ $fail -eq 0 ] && [ $pass -ge 30 ]
