#!/bin/sh
# tboard.sh TESSERA MATRIX_JOB DIR: [output] tensorboard. On 8 ranks (pp x dp x tp) with
# evaluation every 2 steps and [output] metrics, rank 0 alone writes one event file, named
# events.out.tfevents.TIME.HOST, in a folder the run makes; tb_check.py reads it with protobuf
# (python3-protobuf), recomputes both CRCs of every record and finds the metrics' figures in it,
# step for step (also in forward mode). A record with one byte changed, in its length or its data,
# fails the check. A path that is a file, or whose parent is missing, is refused before the run
# naming the file, the line and the fix. Exits 77 (skipped) without python3 and google.protobuf.
set -u
bin=$1 job=$2 dir=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dir"
mkdir -p "$dir"
py=""
for p in python3 /usr/bin/python3; do
  if "$p" -c "import google.protobuf" >/dev/null 2>&1; then
    py=$p
    break
  fi
done
if [ -z "$py" ]; then
  echo "tensorboard: skipped: no python3 with google.protobuf (Debian: apt-get install python3-protobuf)"
  exit 77
fi
fails=0
fail() {
  echo "FAILED: $*"
  fails=$((fails + 1))
}
run() { "$bin" run "$job" --no-progress --set job.steps=4 "$@"; }

# training on 8 ranks, with evaluation; the sgemm peak measured, so MFU is there too
run --set mesh.shape=2,2,1,1,2 --set eval.source=synthetic --set eval.every=2 \
  --set output.metrics="$dir/t.jsonl" --set output.tensorboard="$dir/tb" >"$dir/t.log" 2>&1 ||
  { fail "run"; cat "$dir/t.log"; }
n=$(ls "$dir/tb" | wc -l)
f=$(ls "$dir/tb"/events.out.tfevents.* 2>/dev/null | head -1)
[ "$n" = 1 ] || fail "$n files in the folder, not 1 (rank 0 alone writes)"
host=$(hostname)
case "$(basename "$f")" in
  events.out.tfevents.[0-9]*."$host") ;;
  *) fail "the file is named $(basename "$f"), not events.out.tfevents.TIME.$host" ;;
esac
"$py" "$here/tb_check.py" "$f" "$dir/t.jsonl" || fail "the training run's events"
grep -q '"kind": "eval"' "$dir/t.jsonl" && grep -q '"mfu": [0-9]' "$dir/t.jsonl" ||
  fail "the metrics have no evaluation or no MFU to compare"

# forward mode
run --no-peak --set job.mode=forward --set output.metrics="$dir/f.jsonl" \
  --set output.tensorboard="$dir/tbf" >"$dir/f.log" 2>&1 || { fail "forward run"; cat "$dir/f.log"; }
"$py" "$here/tb_check.py" "$dir"/tbf/events.out.tfevents.* "$dir/f.jsonl" || fail "the forward run's events"

# one byte changed: in the first record's length, then in the last record's data
size=$(wc -c <"$f")
for at in 0 $((size - 6)); do
  cp "$f" "$dir/bad"
  printf '\377' | dd of="$dir/bad" bs=1 seek="$at" conv=notrunc 2>/dev/null
  out=$("$py" "$here/tb_check.py" "$dir/bad" "$dir/t.jsonl")
  case $out in
    *"does not match"* | *"cut short"*) ;;
    *) fail "a byte changed at $at passed the check: $out" ;;
  esac
done

# the path's errors: exit 2, the file, the line and the fix
line=$(($(wc -l <"$job") + 3))
expect() {
  name=$1 re=$2 value=$3
  { cat "$job"; printf '\n[output]\ntensorboard = %s\n' "$value"; } >"$dir/$name.ini"
  "$bin" run "$dir/$name.ini" --no-peak --no-progress >"$dir/$name.log" 2>&1
  code=$?
  { [ "$code" = 2 ] && grep -Eq "$re" "$dir/$name.log"; } || { fail "$name (exit $code)"; cat "$dir/$name.log"; }
}
: >"$dir/afile"
expect file "file\.ini:$line: \[output\] tensorboard: .*afile is not a directory; give a folder \(it is made when absent\)" afile
expect noparent "noparent\.ini:$line: \[output\] tensorboard: .*/nope/tb: its parent .*/nope is not an existing directory; create it first" nope/tb
[ -e "$dir/nope" ] && fail "a refused run made the folder"
[ "$fails" = 0 ] && echo "tensorboard: ok"
