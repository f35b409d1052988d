#!/bin/sh
# mem_check.sh TESSERA JOB DIR: before any model is built, plan and run compare the training
# state of the ranks this process will run with the memory it may use, and refuse a job that
# cannot fit, naming the ranks, the limit and the largest items, with --force to go on. JOB: a
# small synthetic job (dims = dp, shape = 1, no [plugins] section).
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
fails=0
# variant NAME SED...: the job with the sed expressions applied, as $dir/NAME.ini
variant() {
  name=$1
  shift
  sed "$@" "$job" >"$dir/$name.ini"
}
# expect CODE REGEX CMD...: CMD exits CODE within 60 s, its output matches REGEX, no step runs
expect() {
  want=$1 re=$2
  shift 2
  out=$(timeout 60 "$@" 2>&1)
  code=$?
  if [ "$code" != "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$re" ||
    printf '%s\n' "$out" | grep -q '^step '; then
    printf 'FAILED (exit %s, want %s, /%s/): %s\n%s\n' "$code" "$want" "$re" "$*" "$out"
    fails=$((fails + 1))
  fi
}

# 86 G parameters: 1.3 TB of state, refused at once by the bound (one copy must fit), before
# any allocation; plan says the same
variant huge -e 's/^hidden_size .*/hidden_size = 65536/' \
  -e 's/^intermediate_size .*/intermediate_size = 131072/' \
  -e 's/^num_attention_heads .*/num_attention_heads = 64/' \
  -e 's/^num_key_value_heads .*/num_key_value_heads = 64/'
start=$(date +%s)
expect 1 "huge.ini: \[model\] and \[mesh\] shape: the training state of rank 0 needs at least 1280.13 GiB (85.9 G parameters x 16 bytes.*but .* is .*The largest items: the 2 layers' MLP weights (3 x 131072 x 65536 each) 768.00 GiB.*No model was built.*--force to try anyway" \
  "$bin" run "$dir/huge.ini" --no-peak --no-progress
expect 1 "tessera plan: .*huge.ini: \[model\] and \[mesh\] shape: the training state of rank 0 needs at least 1280.13 GiB" \
  "$bin" plan "$dir/huge.ini"
[ $(($(date +%s) - start)) -le 10 ] || { echo "FAILED: the huge job took over 10 s to refuse"; fails=$((fails + 1)); }

# ulimit -v: 63 M parameters (968 MiB of state) in 586 MiB of address space
variant mid -e 's/^hidden_size .*/hidden_size = 1024/' -e 's/^intermediate_size .*/intermediate_size = 4096/' \
  -e 's/^num_hidden_layers .*/num_hidden_layers = 4/' -e 's/^vocab_size .*/vocab_size = 256/'
expect 1 "mid.ini: \[model\] and \[mesh\] shape: the training state of rank 0 needs at least 968.1 MiB.*but ulimit -v = 585.9 MiB, less the .* MiB this process maps already and the 208.0 MiB its 1 rank thread reserves before any tensor (a 128 MiB BLAS buffer, a 64 MiB malloc arena, .*), leaves.*raise the ulimit" \
  sh -c "ulimit -v 600000 && exec \"\$0\" run \"\$1\" --no-peak --no-progress" "$bin" "$dir/mid.ini"
# [checkpoint] async keeps a copy of the parameters and moments: 12 more bytes a parameter
mkdir -p "$dir/ck"
expect 1 "mid.ini: \[model\] and \[mesh\] shape: the training state of rank 0 needs at least 1.65 GiB (0.0634 G parameters x 28 bytes: f32 parameter, gradient, AdamW's two moments, \[checkpoint\] async's copy of the parameter and moments," \
  sh -c "ulimit -v 600000 && exec \"\$0\" run \"\$1\" --no-peak --no-progress --set checkpoint.dir=\"\$2\" --set checkpoint.async=true" "$bin" "$dir/mid.ini" "$dir/ck"
# --force goes on: the model is built, and runs out of memory on its own
expect 1 "memory: --force: the state needs at least 968.1 MiB, more than the .* available" \
  sh -c "ulimit -v 600000 && exec \"\$0\" run \"\$1\" --no-peak --no-progress --force" "$bin" "$dir/mid.ini"

# one copy fits but four do not: dp over 4 ranks keeps a replica each; the layout decides, as
# plan lays it out with each rank's activations (train_act.c), naming the largest rank (1380 MiB of address space: the 4 rank threads
# reserve 800 MiB of it)
variant dp4 -e 's/^hidden_size .*/hidden_size = 512/' -e 's/^intermediate_size .*/intermediate_size = 2048/' \
  -e 's/^num_hidden_layers .*/num_hidden_layers = 3/' -e 's/^vocab_size .*/vocab_size = 256/' \
  -e 's/^shape .*/shape = 4/'
printf '\n[plugins]\nload = dp\n' >>"$dir/dp4.ini"
expect 1 "dp4.ini: \[model\] and \[mesh\] shape: ranks 0..3 (threads of this process) hold 819.0 MiB at the peak of a step (training state and activations) as .plan. lays it out, but ulimit -v = 1380.0 MiB.*The largest rank, 0: parameters 46.0 MiB, gradients 46.0 MiB, AdamW moments 92.0 MiB, activations and the step's workspace 20.7 MiB" \
  sh -c "ulimit -v 1413120 && exec \"\$0\" run \"\$1\" --no-peak --no-progress" "$bin" "$dir/dp4.ini"
expect 1 "tessera plan: .*dp4.ini: .*ranks 0..3 (threads of this process) hold 819.0 MiB" \
  sh -c "ulimit -v 1413120 && exec \"\$0\" plan \"\$1\"" "$bin" "$dir/dp4.ini"
# a limit below what the threads reserve: the BLAS library's threads retry their buffers
# forever, so the refusal must also end the process (it hung at both sizes)
for kib in 60000 150000; do
  expect 1 "\.ini: \[model\] and \[mesh\] shape: .*but ulimit -v = .* MiB, less .* its 1 rank thread reserves before any tensor .*leaves 0.0 MiB.*raise the ulimit" \
    sh -c "ulimit -v $kib && exec \"\$0\" run \"\$1\" --no-peak --no-progress" "$bin" "$job"
  expect 1 "tessera plan: .*but ulimit -v = .* MiB, less .* leaves 0.0 MiB" \
    sh -c "ulimit -v $kib && exec \"\$0\" plan \"\$1\"" "$bin" "$job"
done

# the same job without the limit runs
out=$(timeout 120 "$bin" run "$dir/dp4.ini" --no-peak --no-progress 2>&1) ||
  { printf 'FAILED: dp4 without a limit\n%s\n' "$out"; fails=$((fails + 1)); }
[ "$fails" = 0 ] && echo "mem check: ok"
