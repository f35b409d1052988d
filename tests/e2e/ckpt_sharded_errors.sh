#!/bin/sh
# ckpt_sharded_errors.sh TESSERA JOB OUT: the errors of [checkpoint] dir, every, keep_last and
# load = latest or a checkpoint folder, each with exit 2 and a message naming the job file, the
# line, the key and the fix (or the folder, the tensor and what to check); and load = latest in a
# dir without a complete checkpoint starts from step 0.
set -u
bin=$1 job=$2 out=$3
rm -rf "$out"
mkdir -p "$out"
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
# expect NAME REGEX [--set ...]: OUT/NAME.ini (JOB with OUT/NAME.keys appended) exits 2 with a
# line matching REGEX on stderr
expect() {
  name=$1 re=$2
  shift 2
  cat "$job" "$out/$name.keys" >"$out/$name.ini"
  "$bin" run "$out/$name.ini" --no-peak --no-progress --set job.steps=2 "$@" >"$out/$name.log" 2>&1
  code=$?
  { [ "$code" = 2 ] && grep -Eq "$re" "$out/$name.log"; } ||
    { fail "$name (exit $code)"; cat "$out/$name.log"; }
}
keys() { printf '\n[checkpoint]\n%s\n' "$2" >"$out/$1.keys"; }
# the [checkpoint] header is the job's last line + 2; the key follows it
line=$(($(wc -l <"$job") + 3))

keys every "every = 2"
expect every "every\.ini:$line: \[checkpoint\] every: 2 without \[checkpoint\] dir: set dir"
keys keep "keep_last = 3"
expect keep "keep\.ini:$line: \[checkpoint\] keep_last: 3 without \[checkpoint\] dir: set dir"
keys latest "load = latest"
expect latest "latest\.ini:$line: \[checkpoint\] load: latest without \[checkpoint\] dir: set dir"
keys dirfile "dir = dirfile.ini"
expect dirfile "dirfile\.ini:$line: \[checkpoint\] dir: .*dirfile\.ini is not a directory; give a folder"
keys noparent "dir = /nonexistent/tessera/ckpt"
expect noparent "noparent\.ini:$line: \[checkpoint\] dir: /nonexistent/tessera/ckpt: its parent /nonexistent/tessera is not an existing directory; create it first"
keys none "dir = none-yet
load = latest"
cat "$job" "$out/none.keys" >"$out/none.ini"
"$bin" run "$out/none.ini" --no-peak --no-progress --set job.steps=2 >"$out/none.log" 2>&1 ||
  { fail "load = latest in an empty dir"; cat "$out/none.log"; }
grep -q "no complete checkpoint in .*none-yet yet; starting from step 0" "$out/none.log" ||
  fail "load = latest in an empty dir does not say it starts afresh"
[ -f "$out/none-yet/step-000002/index.json" ] || fail "the run did not save at its last step"

# a damaged index, and a checkpoint of another model
cp -r "$out/none-yet/step-000002" "$out/damaged"
printf '{"format": "tessera-sharded-v1", "step": 2,' >"$out/damaged/index.json"
keys damaged "load = damaged"
expect damaged "damaged\.ini:$((line)): \[checkpoint\] load: .*damaged/index\.json: not valid JSON \(cut short or damaged\); load an earlier checkpoint"
keys other "load = none-yet/step-000002"
expect other "other\.ini:$line: \[checkpoint\] load: .*tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[48, 32\], the model's is \[64, 32\]; the checkpoint does not match the model \(check \[model\]" \
  --set model.intermediate_size=64
# a rank file gone: the slices no longer cover what a rank needs
cp -r "$out/none-yet/step-000002" "$out/lost"
rm "$out/lost/rank-00000.safetensors"
keys lost "load = lost"
expect lost "lost\.ini:$line: \[checkpoint\] load: .*lost/rank-00000\.safetensors"
[ "$fails" = 0 ] && echo "ckpt sharded errors: ok"
