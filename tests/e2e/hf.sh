#!/bin/sh
# hf.sh TESSERA GOLDEN DIR MODE [TOKENIZERS]: Hugging Face folders and generation end to end
# (docs/hf.md, docs/generate.md).
#   generate   greedy continuations of the gqa, tied and moe golden models equal the PyTorch
#              reference's (tests/golden/make_generate.py), with and without the KV cache, on
#              one rank and under tp 2 and 4
#   roundtrip  in -> out -> in: a checkpoint exported (one file, then shards, f32) and read back
#              (export of the folder, training from the folder) is bit-identical, and a job
#              loading the folder takes the golden step
#   errors     malformed config.json, config.json against the job, a missing shard, a tensor of
#              the wrong shape or dtype, rope_scaling, an MoE layout HF has no class for: exit 2,
#              the file and the key or tensor named, nothing written
#   text       train a tokenizer-sized model, then export it with its tokenizer and generate
#              text from the job and from the folder; sampling is seeded
set -u
bin=$1 golden=$2 dir=$3 mode=$4 toks=${5:-}
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1

die() { echo "hf $mode: $*"; exit 1; }

# json_ids FILE KEY: the ids of "KEY": [..] in a one-line JSON file, space-separated
json_ids() { sed -e "s/.*\"$2\": \[\([^]]*\)\].*/\1/" -e 's/,//g' "$1"; }

generate() {
  for case in gqa tied moe; do
    want=$(json_ids "$golden/$case/generate.json" greedy)
    prompt=$(json_ids "$golden/$case/generate.json" prompt)
    n=$(echo "$want" | wc -w)
    for run in "--tp 1" "--tp 1 --no-cache" "--tp 2" "--tp 4 --no-cache"; do
      got=$("$bin" generate "$golden/$case/job.ini" --prompt-ids "$prompt" --max-tokens "$n" \
        --ignore-eos --print-ids $run) || die "$case $run: exit $?"
      [ "$got" = "$want" ] || die "$case $run: got '$got', the reference '$want'"
    done
    # sampling kept to one candidate is greedy, whatever the temperature and seed
    for run in "--top-k 1 --seed 3" "--top-p 0.000001 --seed 4"; do
      got=$("$bin" generate "$golden/$case/job.ini" --prompt-ids "$prompt" --max-tokens "$n" \
        --ignore-eos --print-ids --temperature 5 $run) || die "$case $run: exit $?"
      [ "$got" = "$want" ] || die "$case $run: got '$got', greedy '$want'"
    done
    # an end token stops the continuation after it
    third=$(echo "$want" | cut -d' ' -f3)
    got=$("$bin" generate "$golden/$case/job.ini" --prompt-ids "$prompt" --max-tokens "$n" \
      --print-ids --eos "$third")
    upto=$(echo "$want" | awk -v e="$third" '{for (i = 1; i <= NF; i++) {printf "%s%s", (i > 1 ? " " : ""), $i; if ($i == e) break}}')
    [ "$got" = "$upto" ] || die "$case: --eos $third gave '$got', expected '$upto'"
    # a high temperature over every token leaves the greedy path, and a seed fixes the draw
    a=$("$bin" generate "$golden/$case/job.ini" --prompt-ids "$prompt" --max-tokens "$n" \
      --ignore-eos --print-ids --temperature 5 --seed 1)
    b=$("$bin" generate "$golden/$case/job.ini" --prompt-ids "$prompt" --max-tokens "$n" \
      --ignore-eos --print-ids --temperature 5 --seed 1)
    [ "$a" = "$b" ] && [ "$a" != "$want" ] || die "$case: seeded sampling: '$a' / '$b'"
    echo "hf generate $case: ok ($n tokens; one rank and tp 2, 4; with and without the cache)"
  done
}

roundtrip() {
  for case in gqa moe; do
    job=$golden/$case/job.ini src=$golden/$case/model.safetensors
    "$bin" export "$job" one >/dev/null || die "$case: export"
    [ -f one/model.safetensors ] && [ ! -f one/model.safetensors.index.json ] || die "one file"
    "$bin" compare one/model.safetensors "$src" --rtol 0 --atol 0 | grep -q "MATCH: 0" ||
      die "$case: out differs"
    "$bin" export "$job" shards --checkpoint one --shard-size 40KB >/dev/null || die "shards"
    [ -f shards/model.safetensors.index.json ] && [ ! -f shards/model.safetensors ] || die "index"
    ls shards | grep -q "^model-00001-of-000[0-9][0-9].safetensors$" || die "shard names"
    "$bin" export "$job" back --checkpoint shards >/dev/null || die "$case: export of shards"
    "$bin" compare back/model.safetensors "$src" --rtol 0 --atol 0 | grep -q "MATCH: 0" ||
      die "$case: in -> out -> in differs"
    # a job that loads the folder takes the golden step
    "$bin" run "$job" --no-peak --set checkpoint.load="$PWD/shards" --dump d.safetensors \
      >run.txt 2>&1 || die "$case: run from the folder: $(tail -3 run.txt)"
    "$bin" compare d.safetensors "$golden/$case/expected.safetensors" --rtol 1e-4 --atol 1e-5 |
      grep -q "MATCH: 0" || die "$case: the step from the folder differs"
    # the same export twice is byte for byte the same, and a re-export removes stale shards
    "$bin" export "$job" shards --checkpoint one >/dev/null || die "re-export"
    [ -f shards/model.safetensors ] && [ ! -f shards/model.safetensors.index.json ] &&
      ! ls shards | grep -q "^model-0" || die "stale shards left"
    cmp shards/model.safetensors one/model.safetensors || die "export not deterministic"
    if command -v python3 >/dev/null 2>&1; then
      python3 "$(dirname "$0")/hf_check.py" layout one >/dev/null 2>&1 || true
    fi
    rm -rf one shards back
    echo "hf roundtrip $case: ok"
  done
}

# expect2 WHAT PATTERN CMD...: CMD exits 2 with PATTERN in its message
expect2() {
  what=$1 pat=$2
  shift 2
  "$@" >out.txt 2>&1
  rc=$?
  [ $rc = 2 ] || die "$what: exit $rc, expected 2: $(cat out.txt)"
  grep -q -- "$pat" out.txt || die "$what: no '$pat' in: $(cat out.txt)"
}

errors() {
  job=$golden/gqa/job.ini
  "$bin" export "$job" ok >/dev/null || die "export"
  "$bin" export "$job" sh --shard-size 40KB >/dev/null || die "export shards"
  run() { "$bin" run "$job" --no-peak --set checkpoint.load="$PWD/$1" --dump "$PWD/d.safetensors"; }
  # malformed config.json
  cp -r ok bad && printf '{"model_type": "llama", "hidden_size": 64,' >bad/config.json
  expect2 "malformed" "bad/config.json: not valid JSON" run bad
  # config.json against the job
  rm -rf bad && cp -r ok bad && sed 's/"num_hidden_layers":[^,]*/"num_hidden_layers": 3/' ok/config.json >bad/config.json
  expect2 "disagree" 'bad/config.json: "num_hidden_layers" is 3, but .*job.ini:[0-9]*: \[model\] num_hidden_layers is 2' run bad
  # a key only config.json gives comes from it: a job without [model] keys loads the folder
  grep -v -e '^vocab_size' -e '^hidden_size' -e '^intermediate_size' -e '^num_' -e '^rms_norm' \
    -e '^rope' -e '^tie_' -e '^load' "$job" | sed "s|^\[checkpoint\]|[checkpoint]\nload = $PWD/ok|" |
    sed "s|batch.safetensors|$golden/gqa/batch.safetensors|" >bare.ini
  "$bin" run bare.ini --no-peak --dump "$PWD/d.safetensors" >out.txt 2>&1 || die "bare job: $(cat out.txt)"
  "$bin" compare d.safetensors "$golden/gqa/expected.safetensors" --rtol 1e-4 --atol 1e-5 |
    grep -q "MATCH: 0" || die "bare job: the step differs"
  rm -f d.safetensors
  # unsupported rope type and head_dim
  rm -rf bad && cp -r ok bad &&
    sed 's/"rope_scaling":[^,]*/"rope_scaling": {"rope_type": "llama3", "factor": 8.0}/' ok/config.json >bad/config.json
  expect2 "rope" 'bad/config.json: "rope_scaling" with rope_type .llama3. is not supported' run bad
  rm -rf bad && cp -r ok bad && sed 's/"head_dim":[^,]*/"head_dim": 16/' ok/config.json >bad/config.json
  expect2 "head_dim" 'bad/config.json: "head_dim" is 16' run bad
  # a missing shard named in the index
  rm -rf bad && cp -r sh bad && rm bad/model-00002-of-*.safetensors
  expect2 "missing shard" "model.safetensors.index.json: shard 'model-00002-of-" run bad
  # a tensor of the wrong shape (the gqa weights under a config with fewer kv heads)
  rm -rf bad && cp -r ok bad && sed 's/"num_key_value_heads":[^,]*/"num_key_value_heads": 2/' ok/config.json >bad/config.json
  expect2 "shape" "bad/model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight' has shape" \
    "$bin" generate bad --prompt-ids 1,2 --print-ids
  # a tensor of the wrong dtype: the embedding as I32 (a file written by hand: the 8-byte length,
  # the header padded with spaces to a multiple of 8, the zero bytes of the tensor)
  rm -rf bad && mkdir bad && cp ok/config.json bad/
  hdr='{"model.embed_tokens.weight":{"dtype":"I32","shape":[256,64],"data_offsets":[0,65536]}}'
  while [ $((${#hdr} % 8)) != 0 ]; do hdr="$hdr "; done
  { printf "$(printf '\\%03o' ${#hdr})\000\000\000\000\000\000\000"; printf '%s' "$hdr"
    head -c 65536 /dev/zero; } >bad/model.safetensors
  expect2 "dtype" "bad/model.safetensors: tensor 'model.embed_tokens.weight' is I32" run bad
  [ ! -e d.safetensors ] || die "a failed run wrote its dump"
  # export: an MoE layout without an HF class, a bad checkpoint; nothing written
  expect2 "sparse step" "decoder_sparse_step" "$bin" export "$golden/moe_sparse/job.ini" none
  expect2 "export shape" "tensor 'model.layers.0.self_attn.k_proj.weight' has shape" \
    "$bin" export "$job" none --set model.num_key_value_heads=2
  [ ! -e none ] || die "a failed export wrote its folder"
  expect2 "tp" "\-\-tp 3 must divide num_attention_heads 8" "$bin" generate ok --prompt-ids 1,2 --print-ids --tp 3
  echo "hf errors: ok"
}

text() {
  cp "$toks/spm-llama2.json" tokenizer.json
  tok=$PWD/tokenizer.json
  sed -e 's/^vocab_size = .*/vocab_size = 768/' -e 's/^steps = .*/steps = 2/' \
    -e "s|^load = .*|save = $PWD/ckpt.safetensors|" -e '/^dump = /d' \
    -e 's|^source = .*|source = synthetic|' "$golden/gqa/job.ini" >job.ini
  "$bin" run job.ini --no-peak >run.txt 2>&1 || die "train: $(tail -3 run.txt)"
  a=$("$bin" generate job.ini --tokenizer "$tok" --prompt "Hello world" --max-tokens 12 --temperature 0.8 --top-k 40 --top-p 0.9 --seed 7) ||
    die "generate from the job"
  b=$("$bin" generate job.ini --tokenizer "$tok" --prompt "Hello world" --max-tokens 12 --temperature 0.8 --top-k 40 --top-p 0.9 --seed 7)
  [ "$a" = "$b" ] || die "the same seed gave two continuations"
  "$bin" export job.ini folder --tokenizer "$tok" >/dev/null || die "export with the tokenizer"
  cmp folder/tokenizer.json tokenizer.json || die "tokenizer not copied"
  grep -q '"eos_token_id"' folder/generation_config.json || die "no generation_config.json"
  g1=$("$bin" generate job.ini --tokenizer "$tok" --prompt "Hello world" --max-tokens 8 --print-ids --ignore-eos)
  g2=$("$bin" generate folder --prompt "Hello world" --max-tokens 8 --print-ids --ignore-eos)
  [ "$g1" = "$g2" ] || die "the job and its exported folder generate differently: $g1 / $g2"
  echo "hf text: ok"
}

$mode
