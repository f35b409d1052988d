#!/bin/sh
# act_ckpt.sh TESSERA JOB.ini OUTDIR: activation checkpointing, full and selective, is
# bit-identical to none. Each mesh (and the MoE model, with and without its load-balancing loss)
# runs 3 steps each way; the dumps of step 3 (logits, loss, gradients, parameters after AdamW)
# must agree to the bit, and each checkpointed run must hold less at its peak than none.
set -u
bin=$1 job=$2 dir=$3
mkdir -p "$dir"
fail=0 n=0
moe="--set model.num_local_experts=4 --set model.num_experts_per_tok=2 --set model.decoder_sparse_step=2"
peak() { # the most loaded rank's allocator peak in bytes, from the run's JSON summary
  grep -o '"peak_bytes": [0-9]*' "$1" | tail -1 | cut -d' ' -f2
}
check() { # check NAME DIMS SHAPE PLUGINS EXTRA...
  name=$1 dims=$2 shape=$3 plugins=$4
  shift 4
  for mode in none full selective; do
    "$bin" run "$job" --no-peak --json --set job.steps=3 --dump-step 3 --set mesh.dims="$dims" \
      --set mesh.shape="$shape" --set plugins.load="$plugins" "$@" \
      --set model.activation_checkpointing=$mode --dump "$dir/$name.$mode.safetensors" \
      >"$dir/$name.$mode.log" 2>&1 || { echo "FAIL $name ($mode): exit $?"; tail -3 "$dir/$name.$mode.log"; fail=$((fail + 1)); return; }
  done
  n=$((n + 1))
  p0=$(peak "$dir/$name.none.log")
  for mode in full selective; do
    p=$(peak "$dir/$name.$mode.log")
    if ! "$bin" compare "$dir/$name.none.safetensors" "$dir/$name.$mode.safetensors" --rtol 0 \
      --atol 0 >"$dir/$name.$mode.cmp" 2>&1; then
      echo "FAIL $name ($mode): differs from none"; tail -3 "$dir/$name.$mode.cmp"; fail=$((fail + 1))
    elif [ -z "$p" ] || [ -z "$p0" ] || [ "$p" -ge "$p0" ]; then
      echo "FAIL $name ($mode): peak ${p:-?} bytes is not below none's ${p0:-?}"; fail=$((fail + 1))
    else
      echo "PASS $name ($mode): bit-identical; peak of the most loaded rank $p0 -> $p bytes"
    fi
  done
}
all=dp,tp,pp,cp_ring,cp_ulysses
d5=pp,dp,ring_cp,ulysses_cp,tp
check one $d5 1,1,1,1,1 $all
check dp2 $d5 1,2,1,1,1 $all
check tp2 $d5 1,1,1,1,2 $all
check pp2 $d5 2,1,1,1,1 $all
check ring2_uly2 $d5 1,1,2,2,1 $all
check fsdp2_tp2 pp,dp_shard,ring_cp,ulysses_cp,tp 1,2,1,1,2 $all
check pp2_dp2_tp2 $d5 2,2,1,1,2 $all
check sp $d5 1,1,1,1,2 dp,tp,sp,pp,cp_ring,cp_ulysses
check moe_aux $d5 1,2,1,1,1 $all $moe --set model.router_aux_loss_coef=0.02
check moe_ep2 $d5,ep 1,1,1,1,1,2 $all,ep $moe --set model.router_aux_loss_coef=0.02
check moe_pp2_ep2 $d5,ep 2,1,1,1,1,2 $all,ep $moe --set model.router_aux_loss_coef=0
check every2 $d5 1,2,1,1,1 $all --set model.checkpoint_every=2
check pp2_zero_bubble $d5 2,1,1,1,1 $all --set strategy.pp.schedule=zero_bubble --set strategy.pp.microbatches=4
check fsdp2 pp,dp_shard,ring_cp,ulysses_cp,tp 1,2,1,1,1 $all
echo "activation checkpointing: $n meshes, $fail failed"
[ $fail -eq 0 ] && [ $n -ge 14 ]
