#!/bin/sh
# plan_refuses.sh TESSERA JOB DIR: whatever `run` refuses, `plan` refuses first, with the same
# message and exit code: two communicating rules for one op (tp 2 x ring_cp 2 with one kv head),
# a rule that refuses the inputs another hands it (ulysses_cp 2 x tp 2, one kv head), a local
# world too large for one process, grad_accum_steps that does not divide the batch. A job run
# takes is one plan takes. JOB: a small synthetic job ([mesh] dims and shape on one line each,
# no [plugins] section, num_key_value_heads = 2).
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
fails=0
# variant NAME DIMS SHAPE LOAD [SED]: the job on another mesh, written to $dir/NAME.ini
variant() {
  sed -e "s/^dims .*/dims = $2/" -e "s/^shape .*/shape = $3/" ${5:+-e "$5"} "$job" >"$dir/$1.ini"
  [ -n "$4" ] && printf '\n[plugins]\nload = %s\n' "$4" >>"$dir/$1.ini"
}
# the message without the program's name and the rank that happened to fail first
norm() { sed -e 's/^tessera [a-z]*: //' -e 's/^rank [0-9]*:/rank R:/' -e 's/then ranks [0-9, -]* failed/then ranks R failed/'; }
# refused NAME CODE REGEX: plan and run both exit CODE with the same message matching REGEX, and
# run takes no step
refused() {
  "$bin" plan "$dir/$1.ini" >"$dir/$1.plan.out" 2>"$dir/$1.plan.err"
  pc=$?
  "$bin" run "$dir/$1.ini" --no-peak --no-progress >"$dir/$1.run.out" 2>"$dir/$1.run.err"
  rc=$?
  norm <"$dir/$1.plan.err" >"$dir/$1.plan.msg"
  norm <"$dir/$1.run.err" >"$dir/$1.run.msg"
  if [ "$pc" != "$2" ] || [ "$rc" != "$2" ] || ! grep -q -- "$3" "$dir/$1.plan.msg" ||
    ! cmp -s "$dir/$1.plan.msg" "$dir/$1.run.msg" || grep -q '^step ' "$dir/$1.run.out"; then
    printf 'FAILED %s: plan exit %s, run exit %s, want %s and /%s/ in both\n' "$1" "$pc" "$rc" \
      "$2" "$3"
    printf '  plan: %s\n' "$(cat "$dir/$1.plan.err")"
    printf '  run:  %s\n' "$(cat "$dir/$1.run.err")"
    fails=$((fails + 1))
  fi
}

variant tp_ring_kv1 "tp, ring_cp" "2, 2" "tp, cp_ring" "s/^num_key_value_heads .*/num_key_value_heads = 1/"
refused tp_ring_kv1 1 "op 'sdpa': rules 'tp.sdpa.kv_replicated' (mesh dim 'tp') and 'cp_ring.sdpa' (mesh dim 'ring_cp') both communicate"
variant uly_tp_kv1 "ulysses_cp, tp" "2, 2" "cp_ulysses, tp" "s/^num_key_value_heads .*/num_key_value_heads = 1/"
refused uly_tp_kv1 1 "tp.sdpa.kv_replicated: inputs placed S(2), S(2) on mesh dim 'ulysses_cp'"
variant world4096 "dp, tp" "1024, 4" "dp, tp"
refused world4096 2 "world4096.ini:[0-9]*: \[mesh\] shape: 4096 ranks, but backend = local runs its ranks as threads of one process, at most 1024; use backend = mpi"
variant accum3 "dp" "1" "" "s/^grad_accum_steps .*/grad_accum_steps = 3/"
refused accum3 2 "accum3.ini:[0-9]*: \[optimizer\] grad_accum_steps: 3 does not divide \[data\] batch_size = 4"

# the same meshes with two kv heads run, and plan passes them after their first step
variant tp_ring "tp, ring_cp" "2, 2" "tp, cp_ring"
if ! "$bin" plan "$dir/tp_ring.ini" >"$dir/tp_ring.plan.out" 2>&1 ||
  ! grep -q "^first step: run on 4 ranks" "$dir/tp_ring.plan.out"; then
  printf 'FAILED tp_ring: plan refused a job run takes\n'
  cat "$dir/tp_ring.plan.out"
  fails=$((fails + 1))
fi
[ "$fails" = 0 ] && echo "plan refuses: ok"
