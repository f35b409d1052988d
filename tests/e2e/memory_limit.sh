#!/bin/sh
# memory_limit.sh TESSERA JOB.ini DIR: [job] memory_limit. Below the predicted peak of the
# job, plan and run both refuse it before anything runs, with the same message naming the rank
# and its largest items; above it, run trains. A value that is not a size is refused with its
# file:line and the fix.
set -u
bin=$1 job=$2 dir=$3
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
"$bin" plan "$job" --set job.memory_limit=1M >"$dir/plan.out" 2>"$dir/plan.err"
rc=$?
[ $rc -eq 1 ] || fail "plan exit $rc under 1M"
"$bin" run "$job" --no-peak --set job.memory_limit=1M >"$dir/run.out" 2>"$dir/run.err"
rc=$?
[ $rc -eq 1 ] || fail "run exit $rc under 1M"
grep -q "rank 0 is predicted to need .* Its largest items: activations" "$dir/plan.err" ||
  fail "plan's message: $(cat "$dir/plan.err")"
sed 's/^tessera plan: //' "$dir/plan.err" >"$dir/plan.msg"
sed 's/^tessera run: //' "$dir/run.err" >"$dir/run.msg"
cmp -s "$dir/plan.msg" "$dir/run.msg" || fail "plan and run say different things"
grep -q '^step' "$dir/run.out" && fail "run took a step under the limit"
"$bin" run "$job" --no-peak --set job.memory_limit=64MiB >"$dir/ok.out" 2>&1 ||
  fail "run refused under 64MiB: $(tail -2 "$dir/ok.out")"
# a bad value in the file: file:line and the fix
sed 's/^\[job\]$/[job]\nmemory_limit = lots/' "$job" >"$dir/bad.ini"
"$bin" plan "$dir/bad.ini" >/dev/null 2>"$dir/bad.err"
rc=$?
[ $rc -eq 2 ] || fail "a bad memory_limit: exit $rc"
grep -q "bad.ini:[0-9]*: \[job\] memory_limit: 'lots' is not a size in bytes; write a positive number" \
  "$dir/bad.err" || fail "bad value message: $(cat "$dir/bad.err")"
for v in 0 -5G 12Q 1.5GiBs; do
  "$bin" plan "$job" --set job.memory_limit=$v >/dev/null 2>"$dir/bad.err" && fail "$v accepted"
  grep -q "not a size in bytes" "$dir/bad.err" || fail "$v: $(cat "$dir/bad.err")"
done
echo "memory_limit: refused alike by plan and run: $(cat "$dir/run.msg" | cut -c1-160)..."
