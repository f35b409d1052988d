#!/bin/sh
# fresh_dim.sh TESSERA JOB.ini OUTDIR: the zdp fixture plugin (tests/plugins/zdp.c), which only
# declares that its dim splits the batch, against the 1-rank run over STEPS optimizer steps
# (default 5): alone, and beside tp, pp and cp_ring. Each run's last-step dump (logits, loss,
# gradients, parameters after AdamW, which carry every earlier step's optimizer state) must
# match the 1-rank run's at rtol = atol = 1e-4, and so must the loss of every step; and bytes
# must cross zdp every step, or the data was never split.
set -u
bin=$1 job=$2 dir=$3 steps=${STEPS:-5}
mkdir -p "$dir"
run() { # run NAME DIMS SHAPE PLUGINS
  "$bin" run "$job" --no-peak --no-progress --set "job.steps=$steps" --set "mesh.dims=$2" \
    --set "mesh.shape=$3" --set "plugins.load=$4" --dump "$dir/$1.safetensors" \
    >"$dir/$1.log" 2>&1
}
losses() { grep '^step' "$1" | grep -Eo 'loss [0-9.]+' | awk '{print $2}'; }

run one zdp 1 zdp || { cat "$dir/one.log"; echo "the 1-rank run failed"; exit 1; }
pass=0 fail=0
check() { # check NAME DIMS SHAPE PLUGINS
  if ! run "$@"; then
    cat "$dir/$1.log"
    echo "FAIL $1: the run failed"
    fail=$((fail + 1))
    return
  fi
  if ! "$bin" compare "$dir/$1.safetensors" "$dir/one.safetensors" --rtol 1e-4 --atol 1e-4 \
    >"$dir/$1.cmp" 2>&1; then
    cat "$dir/$1.cmp"
    echo "FAIL $1: the step-$steps dump differs from the 1-rank run"
    fail=$((fail + 1))
    return
  fi
  # the log prints each loss with 4 decimals: equal text, step for step
  if [ "$(losses "$dir/$1.log")" != "$(losses "$dir/one.log")" ] ||
    [ "$(losses "$dir/one.log" | wc -l)" -ne "$steps" ]; then
    paste "$dir/$1.log" "$dir/one.log" | head -20
    echo "FAIL $1: the losses differ from the 1-rank run"
    fail=$((fail + 1))
    return
  fi
  # split, not replicated: the gradient all-reduce moves bytes over zdp every step
  if [ "$(grep '^step' "$dir/$1.log" | grep -Ec 'zdp [0-9.]+ [KM]iB')" -ne "$steps" ]; then
    echo "FAIL $1: no bytes over zdp, so the batch was not split there"
    fail=$((fail + 1))
    return
  fi
  echo "ok $1"
  pass=$((pass + 1))
}
check zdp2 zdp 2 zdp
check zdp4 zdp 4 zdp
check zdp2_tp2 zdp,tp 2,2 zdp,tp
check zdp2_pp2 pp,zdp 2,2 zdp,pp
check zdp2_ring2 zdp,ring_cp 2,2 zdp,cp_ring
check zdp2_tp2_pp2 pp,zdp,tp 2,2,2 zdp,tp,pp
echo "fresh dim over $steps steps: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
