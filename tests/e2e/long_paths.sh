#!/bin/sh
# long_paths.sh TESSERA JOB DIR: paths too long for a buffer are errors, never cut.
#  1. a job file whose path has more than 1,023 characters: its directory was cut, so relative
#     outputs went to a prefix-named directory, exit 0; now exit 2 naming the length;
#  2. --set with a relative path from a current directory longer than the buffer getcwd had:
#     the path was left relative and taken from the job's directory; now it is resolved from
#     the current directory, or refused, never moved.
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
seg=$(printf '%0200d' 0 | tr 0 a)
long="$dir/$seg/$seg/$seg/$seg/$seg/$seg"
mkdir -p "$long"
cp "$job" "$long/job.ini"
printf '\n[output]\ndump = d.safetensors\n' >>"$long/job.ini"
# the directory a cut at 1,023 characters would name, made so that a cut path would work
cut=$(printf '%s' "$long" | cut -c1-1023)
mkdir -p "$cut"
out=$("$bin" run "$long/job.ini" --no-peak --no-progress 2>&1)
code=$?
if [ "$code" != 2 ] || ! echo "$out" | grep -q "the job file's path has [0-9]* characters, more than the 1023"; then
  echo "$out"
  echo "long paths: a job under a long path gave exit $code"
  exit 1
fi
[ -z "$(find "$dir" -name d.safetensors)" ] || { echo "long paths: an output was written"; exit 1; }
# run from its directory: a short relative job path works, the dump lands beside the job
(cd "$long" && "$bin" run job.ini --no-peak --no-progress >/dev/null) || exit 1
[ -f "$long/d.safetensors" ] || { echo "long paths: no dump beside the job"; exit 1; }
rm -f "$long/d.safetensors"
# a relative --set path from that long current directory is never taken from elsewhere
out=$(cd "$long" && "$bin" run "$job" --no-peak --no-progress --set output.dump=x.safetensors 2>&1)
code=$?
if [ -n "$(find "$(dirname "$job")" -maxdepth 1 -name x.safetensors)" ]; then
  rm -f "$(dirname "$job")/x.safetensors"
  echo "long paths: --set output.dump went to the job's directory"
  exit 1
fi
[ "$code" = 2 ] && echo "$out" | grep -q "value longer than 255 characters" ||
  { echo "$out"; echo "long paths: --set from a long directory gave exit $code"; exit 1; }
echo "long paths: ok"
