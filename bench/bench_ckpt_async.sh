#!/bin/sh
# bench_ckpt_async.sh [BUILD] [ROUNDS] [STEPS] [EVERY]: the step time around a sharded save
# ([checkpoint] dir) with and without [checkpoint] async, from the wall-clock times of the
# metrics lines (so a step's interval includes whatever the run did after the step before it:
# the save, or the snapshot, and the step itself while a background write runs).
#
# The model is the 409 MB one of docs/training.md's save figures (8 layers, 512 wide, vocab
# 8192; parameters and AdamW moments), 1 rank, batch 4 x 8 tokens, so a save is about as long as
# a few steps. Each round runs the job sync, then async, STEPS steps (default 12) saving every
# EVERY (default 4; the last step's save, synchronous in both, is left out), and prints per mode:
#   step      median interval of the steps after which nothing was saved
#   save+1    median interval of the step after a save (the save itself, or the snapshot, and
#             that step)
#   save+2,3  median interval of the two steps after that (a background write may still run)
#   wall      the run's wall time from the first metrics line to the last
# and the ratios save+1 / step, sync over async. Quote ratios from one run: the development
# machine has 2 cores shared with other jobs.
set -eu
build=${1:-build}
rounds=${2:-2}
steps=${3:-12}
every=${4:-4}
bin=$build/apps/tessera
job=$(dirname "$0")/../tests/e2e/jobs/mesh_matrix.ini
work=${TMPDIR:-/tmp}/bench_ckpt_async.$$
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
model="--set model.vocab_size=8192 --set model.hidden_size=512 --set model.intermediate_size=1408
  --set model.num_hidden_layers=8 --set model.num_attention_heads=8 --set model.num_key_value_heads=8
  --set data.batch_size=4 --set data.seq_len=8 --set mesh.shape=1,1,1,1,1"
# intervals FILE: "step interval" of every step after the first, from the metrics' times
intervals() {
  sed -n 's/^{"step": \([0-9]*\), "kind": "train", "time": \([0-9.]*\),.*/\1 \2/p' "$1" |
    awk 'NR > 1 { printf "%d %.3f\n", $1, $2 - t } { t = $2 }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# figures FILE: step save+1 save+2,3 wall
figures() {
  intervals "$1" >"$work/iv"
  a=$(awk -v e="$every" -v n="$steps" '($1 - 1) % e != 0 && ($1 - 2) % e != 0 && ($1 - 3) % e != 0 { print $2 }' "$work/iv" | median)
  b=$(awk -v e="$every" -v n="$steps" '($1 - 1) % e == 0 && $1 - 1 < n { print $2 }' "$work/iv" | median)
  c=$(awk -v e="$every" -v n="$steps" '(($1 - 2) % e == 0 || ($1 - 3) % e == 0) && $1 > e { print $2 }' "$work/iv" | median)
  w=$(awk '{ s += $2 } END { printf "%.3f", s }' "$work/iv")
  echo "$a $b $c $w"
}
echo "bench_ckpt_async: $steps steps, a save every $every, 1 rank, 409 MB of state per save"
r=1
while [ "$r" -le "$rounds" ]; do
  for mode in false true; do
    rm -rf "$work/ck"
    # shellcheck disable=SC2086
    "$bin" run "$job" --no-peak --no-progress --set job.steps="$steps" $model \
      --set checkpoint.dir="$work/ck" --set checkpoint.every="$every" \
      --set checkpoint.async=$mode --set output.metrics="$work/m.jsonl" >"$work/log" 2>&1 ||
      { cat "$work/log"; exit 1; }
    set -- $(figures "$work/m.jsonl")
    eval "s_$mode=\$1 p_$mode=\$2 q_$mode=\$3 w_$mode=\$4"
    name=sync
    [ "$mode" = true ] && name=async
    awk -v n="$name" -v r="$r" -v a="$1" -v b="$2" -v c="$3" -v w="$4" 'BEGIN {
      printf "round %d %-5s  step %.3f s  save+1 %.3f s (%.2fx step)  save+2,3 %.3f s  wall %.2f s\n",
        r, n, a, b, b / a, c, w }'
  done
  # shellcheck disable=SC2154
  awk -v a="$p_false" -v b="$p_true" -v x="$w_false" -v y="$w_true" -v r="$r" 'BEGIN {
    printf "round %d ratio  save+1 sync / async %.2fx, wall sync / async %.2fx\n", r, a / b, x / y }'
  r=$((r + 1))
done
