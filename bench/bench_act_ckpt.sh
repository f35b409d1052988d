#!/bin/sh
# bench_act_ckpt.sh [BUILD] [ROUNDS] [STEPS] [--set KEY=VALUE ...]: activation checkpointing's
# memory and time. One rank (or the mesh the --set pairs give, on examples/single.ini's dp, tp
# dims) trains a 4-layer model 512 wide (8 heads, MLP 1408, vocab 8192) on batch 4 x 256 tokens,
# STEPS steps (default 6) with [model] activation_checkpointing = none, full and selective in
# turn, ROUNDS times (default 2), and prints per mode:
#   peak      the allocator peak of the step (MiB), and `tessera plan`'s prediction of it
#   act       that peak less the training state (parameters, gradients, AdamW moments)
#   tok/s     the median tokens/s of the steps after the first
# and each mode's act and tokens/s over none's from the same round. Quote ratios from one round:
# the development machine has 2 cores shared with other jobs.
set -eu
build=${1:-build}
rounds=${2:-2}
steps=${3:-6}
shift $(($# < 3 ? $# : 3))
bin=$build/apps/tessera
job=$(dirname "$0")/../examples/single.ini
work=${TMPDIR:-/tmp}/bench_act_ckpt.$$
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
model="--set model.vocab_size=8192 --set model.hidden_size=512 --set model.intermediate_size=1408
  --set model.num_hidden_layers=4 --set model.num_attention_heads=8 --set model.num_key_value_heads=8
  --set data.batch_size=4 --set data.seq_len=256 --set job.steps=$steps"
extra="$*"
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
r=1
while [ "$r" -le "$rounds" ]; do
  for mode in none full selective; do
    # shellcheck disable=SC2086 # model and extra are --set pairs
    "$bin" run "$job" --no-peak --json $model $extra --set model.activation_checkpointing=$mode \
      >"$work/$mode.log" 2>&1 || { tail -3 "$work/$mode.log"; exit 1; }
    peak=$(grep -o '"peak_bytes": [0-9]*' "$work/$mode.log" | tail -1 | cut -d' ' -f2)
    # shellcheck disable=SC2086 # model and extra are --set pairs
    "$bin" plan "$job" $model $extra --set model.activation_checkpointing=$mode >"$work/$mode.plan" 2>&1
    # the most loaded rank's state and predicted total (ranks alike are printed once)
    state=$(sed -n 's/^  rank[ 0-9,.]*: params .* total \([0-9.]*\) MiB.*/\1/p' "$work/$mode.plan" | sort -n | tail -1)
    planned=$(sed -n 's/.*predicted total .*(\([0-9]*\) bytes).*/\1/p' "$work/$mode.plan" | sort -n | tail -1)
    tps=$(sed -n 's/^{"step": \([0-9]*\),.*"tokens_per_s": \([0-9.]*\),.*/\1 \2/p' "$work/$mode.log" |
      awk '$1 > 1 { print $2 }' | median)
    echo "$mode $peak $tps $state $planned" >>"$work/round$r"
  done
  echo "round $r:"
  awk '{ a = $2 / 1048576 - $4 } NR == 1 { a0 = a; t0 = $3 }
    { printf "  %-9s peak %6.1f MiB (planned %6.1f)  act %6.1f MiB (%.3f of none)  %7.1f tok/s (%.3f of none)\n",
        $1, $2 / 1048576, $5 / 1048576, a, a / a0, $3, $3 / t0 }' "$work/round$r"
  r=$((r + 1))
done
