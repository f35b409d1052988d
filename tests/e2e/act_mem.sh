#!/bin/sh
# act_mem.sh TESSERA JOB.ini [MODE]: `tessera plan` predicts each rank's peak (parameters,
# gradients, AdamW moments and the step's activations, from shapes, placements and the
# pipeline schedule); `tessera run` measures the allocator peak of the least and the most loaded
# rank. Over a sample of the mesh matrix covering every plugin (dp, FSDP, HSDP, tp, sp, pp
# schedules, ring and Ulysses attention, ep with MoE, dp's buckets), each must be within 10 % of
# the prediction for the ranks it stands for. MODE is the activation checkpointing mode.
set -u
bin=$1 job=$2 mode=${3:-none}
out=${TMPDIR:-/tmp}/tessera_act_mem.$$
trap 'rm -f "$out".plan "$out".run' EXIT
moe="--set model.num_local_experts=4 --set model.num_experts_per_tok=2
  --set model.decoder_sparse_step=2 --set model.router_aux_loss_coef=0"
all=dp,tp,pp,cp_ring,cp_ulysses
d5=pp,dp,ring_cp,ulysses_cp,tp
n=0 fail=0
check() { # check NAME DIMS SHAPE PLUGINS EXTRA...
  name=$1 dims=$2 shape=$3 plugins=$4
  shift 4
  set -- --set mesh.dims="$dims" --set mesh.shape="$shape" --set plugins.load="$plugins" \
    --set model.activation_checkpointing="$mode" "$@"
  "$bin" plan "$job" "$@" >"$out".plan 2>&1 || { echo "FAIL $name: plan exit $?"; tail -3 "$out".plan; fail=$((fail + 1)); return; }
  "$bin" run "$job" --no-peak --json "$@" >"$out".run 2>&1 || { echo "FAIL $name: run exit $?"; tail -3 "$out".run; fail=$((fail + 1)); return; }
  n=$((n + 1))
  # the planned totals of every rank; the run's peaks of the least and most loaded rank
  awk -v name="$name" '
    FNR == 1 { file++ }
    file == 1 && /predicted total/ { v = $0; sub(/.*\(/, "", v); sub(/ bytes.*/, "", v); v += 0
      if (!np || v > pmax) pmax = v; if (!np || v < pmin) pmin = v; np++ }
    file == 2 && /"peak_bytes"/ { v = $0; sub(/.*"peak_bytes": /, "", v); sub(/,.*/, "", v); hi = v + 0
      v = $0; sub(/.*"peak_bytes_min": /, "", v); sub(/,.*/, "", v); lo = v + 0 }
    END {
      if (!np || !hi) { printf "FAIL %s: no figures (plan %d lines, run peak %d)\n", name, np, hi; exit 1 }
      rhi = hi / pmax; rlo = lo / pmin
      ok = rhi >= 0.9 && rhi <= 1.1 && rlo >= 0.9 && rlo <= 1.1
      printf "%s %s: most loaded rank measured %d / planned %d = %.3f; least %d / %d = %.3f\n",
        ok ? "PASS" : "FAIL", name, hi, pmax, rhi, lo, pmin, rlo
      exit ok ? 0 : 1
    }' "$out".plan "$out".run || fail=$((fail + 1))
}
check one $d5 1,1,1,1,1 $all
check dp2 $d5 1,2,1,1,1 $all
check dp4 $d5 1,4,1,1,1 $all
check fsdp2 pp,dp_shard,ring_cp,ulysses_cp,tp 1,2,1,1,1 $all
check fsdp4 pp,dp_shard,ring_cp,ulysses_cp,tp 1,4,1,1,1 $all
check hsdp2x2 pp,dp_replicate,dp_shard,ring_cp,ulysses_cp,tp 1,2,2,1,1,1 $all
check tp2 $d5 1,1,1,1,2 $all
check tp4 $d5 1,1,1,1,4 $all
check sp2 $d5 1,1,1,1,2 dp,tp,sp,pp,cp_ring,cp_ulysses
check sp2_dp2 $d5 1,2,1,1,2 dp,tp,sp,pp,cp_ring,cp_ulysses
check ring2 $d5 1,1,2,1,1 $all
check ring4 $d5 1,1,4,1,1 $all
check uly2 $d5 1,1,1,2,1 $all
check uly4 $d5 1,1,1,4,1 $all
check ring2_uly2 $d5 1,1,2,2,1 $all
check pp2_1f1b $d5 2,1,1,1,1 $all
check pp4_1f1b $d5 4,1,1,1,1 $all --set strategy.pp.microbatches=4
check pp2_gpipe $d5 2,1,1,1,1 $all --set strategy.pp.schedule=gpipe --set strategy.pp.microbatches=4
check pp2_interleaved $d5 2,1,1,1,1 $all --set strategy.pp.schedule=interleaved_1f1b --set strategy.pp.stages_per_rank=2 --set strategy.pp.microbatches=4
check pp2_zero_bubble $d5 2,1,1,1,1 $all --set strategy.pp.schedule=zero_bubble --set strategy.pp.microbatches=4
check pp2_dp2_tp2 $d5 2,2,1,1,2 $all
check fsdp2_tp2 pp,dp_shard,ring_cp,ulysses_cp,tp 1,2,1,1,2 $all
check accum2 $d5 1,2,1,1,1 $all --set optimizer.grad_accum_steps=2
# dp's buckets going out during the backward (the job's 0.14 MiB of gradients, 50 KiB buckets)
check dp2_buckets $d5 1,2,1,1,1 $all --set strategy.dp.bucket_mb=0.05
check fsdp2_buckets pp,dp_shard,ring_cp,ulysses_cp,tp 1,2,1,1,1 $all --set strategy.dp.bucket_mb=0.05
check fsdp2_tp2_buckets pp,dp_shard,ring_cp,ulysses_cp,tp 1,2,1,1,2 $all --set strategy.dp.bucket_mb=0.05
check moe $d5 1,1,1,1,1 $all $moe
check moe_ep2 $d5,ep 1,1,1,1,1,2 $all,ep $moe
check moe_ep2_dp2 $d5,ep 1,2,1,1,1,2 $all,ep $moe
check moe_ep2_tp2 $d5,ep 1,1,1,1,2,2 $all,ep $moe
echo "activation memory ($mode): $n meshes, $fail failed"
[ $fail -eq 0 ] && [ $n -ge 30 ]
