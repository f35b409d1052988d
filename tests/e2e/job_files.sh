#!/bin/sh
# job_files.sh TESSERA JOB DIR: the job's files are checked before any step, in `plan` too.
# Each case must exit 2 with its message and print no step line: before these checks a missing
# output directory or an output over an input was found (or not) only after the work.
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir/sub"
fails=0
# expect CODE REGEX CMD...: CMD exits CODE, its output matches REGEX and has no step line
expect() {
  want=$1 re=$2
  shift 2
  out=$("$@" 2>&1)
  code=$?
  if [ "$code" != "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$re" ||
    printf '%s\n' "$out" | grep -q '^step '; then
    printf 'FAILED (exit %s, want %s, /%s/): %s\n%s\n' "$code" "$want" "$re" "$*" "$out"
    fails=$((fails + 1))
  fi
}
run() { "$bin" run "$job" --no-peak --no-progress "$@"; }
printf 'hello tokens hello tokens hello tokens hello tokens hello tokens\n' >"$dir/data.txt"
cp "$job" "$dir/job.ini"
ln "$dir/data.txt" "$dir/data_link.txt"
mkfifo "$dir/fifo"

# outputs: a missing directory, a directory, a FIFO
expect 2 "--set checkpoint.save: /nonexistent/x.safetensors: its directory /nonexistent does not exist" \
  run --set job.steps=3000 --set checkpoint.save=/nonexistent/x.safetensors
expect 2 "--set checkpoint.save: .*/sub is a directory" run --set checkpoint.save="$dir/sub"
expect 2 "--set output.dump: .*/sub is a directory" run --set output.dump="$dir/sub"
expect 2 "--set output.trace: .*/nonexistent/t.json: its directory .* does not exist" \
  run --set output.trace="$dir/nonexistent/t.json"
expect 2 "--set output.dump: .*/fifo is a FIFO" run --set output.dump="$dir/fifo"
# the optimizer file beside the save path counts as an output too
mkdir "$dir/c.optim.safetensors"
expect 2 "--set checkpoint.save: the optimizer file .*/c.optim.safetensors is a directory" \
  run --set checkpoint.save="$dir/c.safetensors"
# inputs: missing, a directory, a FIFO (which must not hang)
expect 2 "--set data.source: .*/missing.bin: cannot open" run --set data.source="tokens:$dir/missing.bin"
expect 2 "--set data.source: .*/sub is a directory" run --set data.source="text:$dir/sub"
expect 2 "--set data.source: .*/fifo is a FIFO" timeout 10 "$bin" run "$job" --set data.source="text:$dir/fifo"
expect 2 "--set checkpoint.load: .*/fifo is a FIFO" timeout 10 "$bin" run "$job" --set checkpoint.load="$dir/fifo"
# an output that is an input: by name, by a hard link, the job file
expect 2 "--set checkpoint.save: .*/data.txt is the same file as \[data\] source" \
  run --set data.source="text:$dir/data.txt" --set checkpoint.save="$dir/data.txt"
expect 2 "--set output.dump: .*/data_link.txt is the same file as \[data\] source (.*/data.txt)" \
  run --set data.source="text:$dir/data.txt" --set output.dump="$dir/data_link.txt"
expect 2 "--set checkpoint.save: .*/job.ini is the same file as the job file" \
  "$bin" run "$dir/job.ini" --no-peak --set checkpoint.save="$dir/job.ini"
# two outputs on one path
expect 2 "--set output.dump: .*/o.safetensors is also \[checkpoint\] save" \
  run --set checkpoint.save="$dir/o.safetensors" --set output.dump="$dir/o.safetensors"
# plan refuses what run refuses
sed "s|^source = .*|source = tokens:missing.bin|" "$job" >"$dir/plan_data.ini"
expect 2 "plan_data.ini:[0-9]*: \[data\] source: .*/missing.bin: cannot open" "$bin" plan "$dir/plan_data.ini"
printf '\n[checkpoint]\nsave = nowhere/x.safetensors\n' >>"$dir/job.ini"
expect 2 "job.ini:[0-9]*: \[checkpoint\] save: .*nowhere/x.safetensors: its directory" "$bin" plan "$dir/job.ini"
if [ "$(id -u)" != 0 ]; then
  mkdir "$dir/ro" && chmod 555 "$dir/ro"
  expect 2 "--set output.dump: .*/ro/d.safetensors: its directory .* is not writable" \
    run --set output.dump="$dir/ro/d.safetensors"
fi
# the data file and the job file are untouched
printf 'hello tokens hello tokens hello tokens hello tokens hello tokens\n' | cmp - "$dir/data.txt" || fails=$((fails + 1))
[ "$fails" = 0 ] && echo "job files: ok"
