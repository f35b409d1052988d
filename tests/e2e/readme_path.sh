#!/bin/sh
# readme_path.sh SRC TESSERA OUTDIR STEPS: runs the README's block from raw text to generate and
# export (the sh block after the e2e_readme_path marker) as written, in a copy of the files it
# reads (OUTDIR mirrors the tree: examples/, the tokenizer, build/apps/tessera), with one change:
# the training run takes STEPS steps. Checks that every command succeeds, the loss falls, the
# continuation is not empty, the folder holds what Hugging Face loads, and the folder generates
# what the job does (the export keeps the weights).
set -u
src=$1 bin=$2 dir=$3 steps=$4
rm -rf "$dir"
mkdir -p "$dir/examples/data" "$dir/tests/data/tokenizer" "$dir/build/apps"
cd "$dir" || exit 1
die() { echo "readme path: $*"; exit 1; }

cp "$src/examples/llama-bpe.ini" examples/
cp "$src/examples/data/tessera-docs.txt" examples/data/
cp "$src/tests/data/tokenizer/bytelevel-llama3.json" tests/data/tokenizer/
ln -s "$bin" build/apps/tessera
awk '/e2e_readme_path/ { on = 1; next } on && /^```sh/ { body = 1; next }
     body && /^```/ { exit } body { print }' "$src/README.md" >block.sh
[ "$(grep -c 'tessera' block.sh)" -ge 5 ] || die "no README block found: $(cat block.sh)"
grep -q '^./build/apps/tessera run examples/llama-bpe.ini$' block.sh || die "no run line"
sed "s|^./build/apps/tessera run examples/llama-bpe.ini$|& --no-peak --set job.steps=$steps|" \
  block.sh >run.sh

n=0
while IFS= read -r line; do
  n=$((n + 1))
  sh -c "$line" >"step$n.log" 2>&1 || die "line $n failed: $line
$(tail -5 "step$n.log")"
done <run.sh

run=$(grep -l '^done: ' step*.log | head -1)
[ -n "$run" ] || die "no training log"
first=$(sed -n 's/.*loss \([0-9.]*\) -> \([0-9.]*\)$/\1/p' "$run")
last=$(sed -n 's/.*loss \([0-9.]*\) -> \([0-9.]*\)$/\2/p' "$run")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' || die "loss $first -> $last"
for f in config.json model.safetensors tokenizer.json generation_config.json; do
  [ -s "out/llama-bpe-hf/$f" ] || die "out/llama-bpe-hf/$f missing"
done
gens=$(grep -n 'generate' run.sh | cut -d: -f1)
# shellcheck disable=SC2086 # two line numbers
set -- $gens
[ $# -eq 2 ] || die "expected two generate lines"
[ -s "step$1.log" ] || die "generate printed nothing"
cmp -s "step$1.log" "step$2.log" || die "the folder generates other text than the job:
$(cat "step$1.log")
---
$(cat "step$2.log")"
echo "readme path: $n commands ran, loss $first -> $last in $steps steps, continuation: $(head -c 80 "step$1.log" | tr '\n' ' ')"
