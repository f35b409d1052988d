#!/bin/sh
# `tessera generate` tokens/s with and without the KV cache, on one rank.
#
#   bench/bench_generate.sh [BUILD_DIR]
#
# Trains one step of a Llama of about 58 M parameters (hidden 512, 8 layers, 8 heads / 4 kv,
# intermediate 1408, vocab 32000, untied; TOKENS=N sets the new tokens, default 128) from a
# random start to get a checkpoint, then continues a 32-token prompt greedily for N new tokens
# twice: with the KV cache (each new token runs one position) and with --no-cache (each new
# token runs the whole sequence again), and with the cache under --tp 2 (two ranks, threads of
# this process, splitting the cores). Prints the --stats lines and the cache's speed-up. The
# continuations are the same with and without the cache (checked).
set -eu
build=${1:-build}
tessera="$build/apps/tessera"
[ -x "$tessera" ] || { echo "bench_generate.sh: $tessera not built" >&2; exit 2; }
tokens=${TOKENS:-128}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/job.ini" <<INI
[job]
mode = train
steps = 1
seed = 1
[mesh]
dims = dp
shape = 1
[model]
vocab_size = 32000
hidden_size = 512
intermediate_size = 1408
num_hidden_layers = 8
num_attention_heads = 8
num_key_value_heads = 4
[data]
source = synthetic
batch_size = 1
seq_len = 32
[checkpoint]
save = model.safetensors
INI
"$tessera" run "$dir/job.ini" --no-peak >/dev/null
prompt=$(seq 1 32 | tr '\n' ',')
for mode in cache no-cache tp2; do
  flag=""
  [ $mode = no-cache ] && flag=--no-cache
  [ $mode = tp2 ] && flag="--tp 2"
  "$tessera" generate "$dir/job.ini" --prompt-ids "$prompt" --max-tokens "$tokens" \
    --ignore-eos --print-ids --stats $flag >"$dir/$mode.ids" 2>"$dir/$mode.txt"
  cat "$dir/$mode.txt"
done
cmp -s "$dir/cache.ids" "$dir/no-cache.ids" || { echo "bench_generate.sh: continuations differ" >&2; exit 1; }
cmp -s "$dir/cache.ids" "$dir/tp2.ids" || echo "bench_generate.sh: tp 2 continued differently (rounding)" >&2
a=$(sed -n 's/.*new tokens in .* s (\([0-9.]*\) tokens\/s.*/\1/p' "$dir/cache.txt")
b=$(sed -n 's/.*new tokens in .* s (\([0-9.]*\) tokens\/s.*/\1/p' "$dir/no-cache.txt")
echo "KV cache: $a tokens/s, without: $b tokens/s ($(echo "$a $b" | awk '{printf "%.1f", $1 / $2}')x), $tokens new tokens after 32, $(nproc) cores"
