#!/bin/sh
# doc_mask.sh TESSERA TOKENIZER.json TEXT OUTDIR MODE: [data] mask = document end to end, on a
# corpus tokenized here (TEXT, one document per line, through TOKENIZER.json).
#   mesh    one training step under dp, tp (kv heads split and replicated), tp + sp, FSDP x tp,
#           pp (1f1b, interleaved, zero bubble), ring_cp (contiguous and zigzag), ulysses_cp,
#           ring_cp x ulysses_cp, pp x dp x tp and dp x zigzag ring_cp equals the 1-rank
#           document-masked step (tessera compare at rtol = atol = 1e-4), and the 1-rank step
#           itself differs from the causal one (so the comparison sees the mask); ring, Ulysses
#           and tp 4 on the emulated device equal their CPU runs bit for bit, and activation
#           checkpointing leaves the step unchanged bit for bit (1 rank, zero-bubble pp); the
#           [eval] loss on documents is the same on 1 rank and dp x ring_cp, and not the causal one;
#           MoE layers under ep x ring_cp equal their 1-rank run
#   errors  mask = document without an index, on a text: / synthetic source, with an index that
#           does not pair with the token file, and under a
#           plugin whose attention rule predates document masking (TESSERA_PLUGIN_PATH must
#           hold tests/plugins' oldattn): exit != 0, the file and key or the plugin named
set -u
bin=$1 tok=$2 text=$3 dir=$4 mode=$5
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1

die() { echo "doc_mask $mode: $*"; exit 1; }

"$bin" tokenize "$tok" -o docs.bin "$text" --no-progress >tok.log 2>&1 || die "$(cat tok.log)"
cat >job.ini <<'INI'
[job]
steps = 1
seed = 7

[mesh]
dims = dp
shape = 1

[model]
vocab_size = 768
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 4
num_attention_heads = 4
num_key_value_heads = 2

[data]
source = tokens:docs.bin
batch_size = 4
seq_len = 64
mask = document
INI

mesh() {
  "$bin" run job.ini --no-peak --dump one.st >one.log 2>&1 || die "1 rank: $(tail -3 one.log)"
  "$bin" run job.ini --no-peak --set data.mask=causal --dump causal.st >causal.log 2>&1 ||
    die "causal: $(tail -3 causal.log)"
  if "$bin" compare one.st causal.st >causal.cmp 2>&1; then
    die "the document-masked step equals the causal one: the mask does nothing"
  fi
  fail=0 n=0
  while read -r dims shape plugins extra; do
    n=$((n + 1))
    name=$(echo "$dims=$shape$extra" | tr ',= ' '___')
    # shellcheck disable=SC2086 # extra is "--set KEY=VALUE" pairs or empty
    "$bin" run job.ini --no-peak --set "mesh.dims=$dims" --set "mesh.shape=$shape" \
      --set "plugins.load=$plugins" $extra --dump "$name.st" >"$name.log" 2>&1
    if [ $? -ne 0 ]; then
      fail=$((fail + 1))
      echo "FAIL $dims = $shape ($plugins) $extra: $(tail -2 "$name.log")"
    elif "$bin" compare "$name.st" one.st --rtol 1e-4 --atol 1e-4 >"$name.cmp" 2>&1; then
      echo "PASS $dims = $shape ($plugins) $extra: $(grep '^max' "$name.cmp" | sed 's/, max rel.*//')"
    else
      fail=$((fail + 1))
      echo "FAIL $dims = $shape ($plugins) $extra: differs from the 1-rank run"
      tail -4 "$name.cmp"
    fi
  done <<'MESHES'
dp 2 dp
tp 2 tp
tp 2 tp,sp
pp 2 pp
pp 2 pp --set strategy.pp.schedule=interleaved_1f1b --set strategy.pp.stages_per_rank=2 --set strategy.pp.microbatches=4
pp 2 pp --set strategy.pp.schedule=zero_bubble --set strategy.pp.microbatches=4
ring_cp 2 cp_ring
ring_cp 2 cp_ring --set strategy.cp_ring.load_balance=zigzag
ulysses_cp 2 cp_ulysses
ring_cp,ulysses_cp 2,2 cp_ring,cp_ulysses
tp 4 tp
dp_shard,tp 2,2 dp,tp
pp,dp,tp 2,2,2 pp,dp,tp
dp,ring_cp 2,2 dp,cp_ring --set strategy.cp_ring.load_balance=zigzag
MESHES
  [ $fail -eq 0 ] || die "$fail of $n meshes failed"
  # the emulated device runs the kernels with segment ids through its table: bit for bit the CPU
  for m in "ring_cp 2 cp_ring" "ulysses_cp 2 cp_ulysses" "tp 4 tp"; do
    # shellcheck disable=SC2086 # three words: dim, size, plugin
    set -- $m
    "$bin" run job.ini --no-peak --set job.device=emu --set "mesh.dims=$1" --set "mesh.shape=$2" \
      --set "plugins.load=$3" --dump "emu_$1.st" >"emu_$1.log" 2>&1 || die "emu $1: $(tail -2 "emu_$1.log")"
    "$bin" compare "emu_$1.st" "$1_$2.st" --rtol 0 --atol 0 >"emu_$1.cmp" 2>&1 ||
      die "emu $1 differs from the CPU: $(tail -2 "emu_$1.cmp")"
  done
  # activation checkpointing recomputes each layer (full) or its RoPE at document positions,
  # norms and SwiGLU (selective) in the backward: bit for bit the step without it, on one rank,
  # on the ring and under pipelines whose backwards run out of order
  for m in "dp 1 dp" "ring_cp 2 cp_ring" "pp 2 pp zero_bubble"; do
    # shellcheck disable=SC2086 # three or four words: dim, size, plugin, schedule
    set -- $m
    "$bin" run job.ini --no-peak --set "mesh.dims=$1" --set "mesh.shape=$2" --set "plugins.load=$3" \
      ${4:+--set strategy.pp.schedule=$4 --set strategy.pp.microbatches=4} --dump "ac_$1.st" \
      >"ac_$1.log" 2>&1 || die "$1 = $2: $(tail -2 "ac_$1.log")"
    for mode in full selective; do
      "$bin" run job.ini --no-peak --set "mesh.dims=$1" --set "mesh.shape=$2" --set "plugins.load=$3" \
        ${4:+--set strategy.pp.schedule=$4 --set strategy.pp.microbatches=4} \
        --set model.activation_checkpointing=$mode --dump "ac_$1_$mode.st" >"ac_$1_$mode.log" 2>&1 ||
        die "$1 = $2, checkpointed ($mode): $(tail -2 "ac_$1_$mode.log")"
      "$bin" compare "ac_$1_$mode.st" "ac_$1.st" --rtol 0 --atol 0 >"ac_$1.cmp" 2>&1 ||
        die "activation checkpointing ($mode) changes the document-masked step on $1 = $2: $(tail -2 "ac_$1.cmp")"
    done
  done
  # MoE layers with expert parallelism beside the ring: the router and experts see the same
  # tokens whatever the mask; attention is the ring's with segment ids
  moe="--set model.num_local_experts=4 --set model.num_experts_per_tok=2 --set model.decoder_sparse_step=2"
  # shellcheck disable=SC2086 # moe is --set pairs
  "$bin" run job.ini --no-peak $moe --dump moe_one.st >moe_one.log 2>&1 || die "moe: $(tail -2 moe_one.log)"
  # shellcheck disable=SC2086 # moe is --set pairs
  "$bin" run job.ini --no-peak $moe --set mesh.dims=ep,ring_cp --set mesh.shape=2,2 \
    --set plugins.load=ep,cp_ring --dump moe_ep.st >moe_ep.log 2>&1 || die "moe ep: $(tail -2 moe_ep.log)"
  "$bin" compare moe_ep.st moe_one.st --rtol 1e-4 --atol 1e-4 >moe.cmp 2>&1 ||
    die "MoE under ep x ring_cp differs from its 1-rank run: $(tail -2 moe.cmp)"
  # [eval] on packed documents reads the index of its own source: the same loss on every mesh
  for m in "dp 1 dp" "dp,ring_cp 2,2 dp,cp_ring"; do
    # shellcheck disable=SC2086 # three words: dims, shape, plugins
    set -- $m
    "$bin" run job.ini --no-peak --set "mesh.dims=$1" --set "mesh.shape=$2" --set "plugins.load=$3" \
      --set eval.source=tokens:docs.bin --set eval.batches=2 >"eval_$3.log" 2>&1 ||
      die "eval on $1 = $2: $(tail -2 "eval_$3.log")"
    grep '^eval ' "eval_$3.log" | sed 's/(.*//' >"eval_$3.txt"
  done
  [ -s eval_dp.txt ] && cmp -s eval_dp.txt eval_dp,cp_ring.txt ||
    die "the document-masked evaluation differs: $(cat eval_dp.txt) / $(cat eval_dp,cp_ring.txt)"
  "$bin" run job.ini --no-peak --set eval.source=tokens:docs.bin --set eval.batches=2 \
    --set data.mask=causal >eval_causal.log 2>&1 || die "causal eval: $(tail -2 eval_causal.log)"
  grep '^eval ' eval_causal.log | sed 's/(.*//' | cmp -s - eval_dp.txt &&
    die "the evaluation does not see the mask: $(cat eval_dp.txt)"
  echo "doc_mask mesh: $n meshes equal the 1-rank document-masked step, and on emu bit for bit"

}

# refused RC PATTERN ARGS...: `tessera run job.ini ARGS` exits RC and says PATTERN
refused() {
  want=$1 pattern=$2
  shift 2
  "$bin" run job.ini --no-peak "$@" >err.log 2>&1
  rc=$?
  [ $rc -eq "$want" ] || die "$*: exit $rc, expected $want: $(tail -2 err.log)"
  grep -q "$pattern" err.log || die "$*: no '$pattern' in: $(tail -2 err.log)"
  echo "refused ($*): $(grep -o "$pattern.*" err.log | head -1 | cut -c1-150)"
}

errors() {
  head -n 20 "$text" >short.txt
  "$bin" tokenize "$tok" -o short.bin short.txt --no-progress >/dev/null 2>&1 || die "short"
  mv docs.bin.idx kept.idx
  refused 2 "job.ini:21: \[data\] mask: the document index of docs.bin: .*docs.bin.idx: cannot open"
  mv kept.idx docs.bin.idx
  cp short.bin noidx.bin
  refused 2 "job.ini:21: \\[data\\] mask, for \\[eval\\] source: the document index of .*noidx.bin" \
    --set eval.source=tokens:noidx.bin
  refused 2 "job.ini:21: \[data\] mask: .*text:.*has no documents" --set "data.source=text:$text"
  refused 2 "job.ini:21: \[data\] mask: .*synthetic has no documents" --set data.source=synthetic
  # an index that is not the token file's
  refused 2 "token file docs.bin: .* its index .*short.bin.idx says .* not a pair" \
    --set data.index=short.bin.idx
  # a plugin whose attention rule predates document masking (tests/plugins/oldattn.c, on
  # TESSERA_PLUGIN_PATH): refused by name, before its rule could attend across documents
  refused 1 "plugin 'oldattn' runs attention on mesh dim 'oldcp' (rule 'oldattn.sdpa') but has no rule for document-masked attention" \
    --set mesh.dims=oldcp --set mesh.shape=2 --set plugins.load=oldattn
  # the same mesh runs with mask = causal
  "$bin" run job.ini --no-peak --set mesh.dims=oldcp --set mesh.shape=2 \
    --set plugins.load=oldattn --set data.mask=causal >causal_old.log 2>&1 ||
    die "oldattn with mask = causal: $(tail -2 causal_old.log)"
  echo "doc_mask errors: every bad job refused"
}

case $mode in
  mesh) mesh ;;
  errors) errors ;;
  *) die "unknown mode" ;;
esac
