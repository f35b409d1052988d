#!/bin/sh
# `tessera tokenize` beside the reference implementation of Hugging Face tokenizers (its
# JavaScript port, @huggingface/tokenizers) on the same input: MB/s per core of each, their
# ratio, and a check that both produced the same ids.
#
#   bench/compare_tokenize.sh [BUILD_DIR] [TOKENIZER.json...]
#
# defaults: build; the two test tokenizers of tests/data/tokenizer, one per family. The input
# is docs/, README.md, examples/data and the tokenizer test corpus (ASCII prose and code, CJK,
# emoji, ...) repeated to about 10 MB, one document per line; INPUT=FILE takes another.
# The reference runs under Node.js with NODE_PATH naming a node_modules that holds
# @huggingface/tokenizers (default /tmp/tokref/node_modules; install it there with
#   npm install --prefix /tmp/tokref @huggingface/tokenizers@0.2.0).
#
# Per core: input bytes over the CPU seconds (user + system) of the encoding, tessera on one
# thread, the reference in its single-threaded loop; CPU time, not wall time, so other jobs on
# a shared machine change the figure less. Wall-clock MB/s of tessera on every core is printed
# too.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- "$root/tests/data/tokenizer/bytelevel-llama3.json" \
  "$root/tests/data/tokenizer/spm-llama2.json"
tessera="$build/apps/tessera"
[ -x "$tessera" ] || { echo "compare_tokenize.sh: $tessera not built" >&2; exit 2; }
export NODE_PATH="${NODE_PATH:-/tmp/tokref/node_modules}"
node -e 'require("@huggingface/tokenizers")' 2>/dev/null || {
  echo "compare_tokenize.sh: node finds no @huggingface/tokenizers on NODE_PATH=$NODE_PATH" >&2
  exit 2
}
work=$(mktemp -d /tmp/compare_tokenize.XXXXXX)
trap 'rm -rf "$work"' EXIT
input=${INPUT:-}
if [ -z "$input" ]; then
  input="$work/input.txt"
  cat "$root"/docs/*.md "$root/README.md" "$root/examples/data/tessera-docs.txt" \
    "$root/tests/data/tokenizer/corpus.txt" >"$work/base.txt"
  : >"$input"
  while [ "$(wc -c <"$input")" -lt 10000000 ]; do cat "$work/base.txt" >>"$input"; done
fi
mb=$(awk -v b="$(wc -c <"$input")" 'BEGIN { printf "%.2f", b / 1e6 }')
cores=$(nproc)
echo "input: $input, $mb MB; $cores cores; tessera $("$tessera" --version)"
for tok in "$@"; do
  name=$(basename "$tok" .json)
  eos=$("$tessera" tokenize "$tok" -o "$work/probe.bin" "$root/tests/data/tokenizer/corpus.txt" \
    --no-progress | sed -n 's/.*(EOS \(.*\) from .*/\1/p')
  # tessera on one thread; it reports the CPU seconds of its encoding pipeline
  t_out=$("$tessera" tokenize "$tok" -o "$work/t.bin" "$input" --threads 1 --no-progress)
  tcpu=$(echo "$t_out" | sed -n 's/.*(\([0-9.]*\) CPU s,.*/\1/p')
  twall=$(echo "$t_out" | sed -n 's/.* in \([0-9.]*\) s:.*/\1/p')
  all=$("$tessera" tokenize "$tok" -o "$work/a.bin" "$input" --no-progress |
    sed -n 's/.*: \([0-9.]*\) MB\/s, .* on \([0-9]*\) threads* (.*/\1 MB\/s on \2 thread(s), wall/p')
  ref=$(node "$root/bench/tokenize_ref.mjs" "$tok" "$input" "$eos" "$work/ref.ids")
  "$tessera" decode "$tok" "$work/t.bin" --print-ids >"$work/t.ids"
  same=$(cmp -s "$work/t.ids" "$work/ref.ids" && echo "same ids" || echo "IDS DIFFER")
  rcpu=$(echo "$ref" | sed -n 's/.*cpu_s=\([0-9.]*\).*/\1/p')
  echo "== $name: $same ($(wc -l <"$work/t.ids") documents)"
  echo "   tessera    1 thread: $(awk -v m="$mb" -v c="$tcpu" 'BEGIN { printf "%.2f", m / c }') MB/s per core ($tcpu CPU s, $twall s wall); all cores: $all"
  echo "   reference  1 thread: $(awk -v m="$mb" -v c="$rcpu" 'BEGIN { printf "%.2f", m / c }') MB/s per core ($rcpu CPU s)"
  echo "   ratio: $(awk -v a="$tcpu" -v b="$rcpu" 'BEGIN { printf "%.1fx", b / a }') (tessera / reference, MB/s per core)"
done
