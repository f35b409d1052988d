#!/bin/sh
# trace_symlink.sh TESSERA PP_JOB DIR: [output] trace is written like every output, to a
# temporary renamed over the path: a symlink there is replaced, its target left alone, and a file
# it replaces keeps its mode.
set -eu
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
echo "precious" >"$dir/target.txt"
ln -s target.txt "$dir/trace.json"
"$bin" run "$job" --no-peak --no-progress --stop-at 1 --set output.trace="$dir/trace.json" >/dev/null
[ "$(cat "$dir/target.txt")" = precious ] || { echo "trace: the symlink's target was overwritten"; exit 1; }
[ ! -L "$dir/trace.json" ] && grep -q '"ph": "X"' "$dir/trace.json"
chmod 600 "$dir/trace.json"
"$bin" run "$job" --no-peak --no-progress --stop-at 1 --set output.trace="$dir/trace.json" >/dev/null
[ "$(stat -c %a "$dir/trace.json")" = 600 ] || { echo "trace: mode not kept"; exit 1; }
[ "$(ls "$dir" | wc -l)" = 2 ] || { ls "$dir"; echo "trace: temporaries left"; exit 1; }
echo "trace symlink: ok"
