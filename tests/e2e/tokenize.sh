#!/bin/sh
# tokenize.sh TESSERA DATA DIR MODE [NAME]: `tessera tokenize` and `tessera decode` end to end on
# the files of tests/data/tokenizer (DATA).
#   golden NAME  the corpus through NAME.json on 3 threads equals NAME.stream.txt, the ids the
#                reference implementation gives (with BOS, EOS after each document), in the
#                uint16 and the uint32 format
#   roundtrip    decode gives the input back: text and JSONL, one document per line or per file,
#                empty lines kept
#   threads      the output does not depend on the thread count (an input of several chunks)
#   errors       bad input: exit 2, the file, line or JSON key named, nothing written
set -u
bin=$1 data=$2 dir=$3 mode=$4 name=${5:-}
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1

die() { echo "tokenize $mode: $*"; exit 1; }

golden() {
  tok=$data/$name.json
  "$bin" tokenize "$tok" -o c.bin "$data/corpus.jsonl" --threads 3 >out.txt || die "$(cat out.txt)"
  "$bin" decode "$tok" c.bin --print-ids >ids.txt || die "decode failed"
  cmp ids.txt "$data/$name.stream.txt" || die "$name: ids differ from the reference"
  "$bin" tokenize "$tok" -o c32.bin "$data/corpus.jsonl" --dtype u32 >/dev/null || die "u32"
  "$bin" decode "$tok" tokens32:c32.bin --no-index --print-ids | tr ' ' '\n' >all32.txt
  tr ' ' '\n' <"$data/$name.stream.txt" >all.txt
  cmp all32.txt all.txt || die "$name: the uint32 file differs"
  [ "$(wc -c <c32.bin)" = $(($(wc -c <c.bin) * 2)) ] || die "$name: uint32 size"
  echo "tokenize golden $name: ok ($(wc -l <ids.txt) documents)"
}

roundtrip() {
  # byte-level BPE gives back any text; SentencePiece-style files too when special tokens in
  # the text are taken as text (Llama 2's Prepend puts a ▁ after each special token)
  for case in "bytelevel-llama3:" "bytelevel-gpt2:--split-special" "spm-llama2:--split-special"; do
    n=${case%%:*} flag=${case#*:}
    # shellcheck disable=SC2086 # flag is one word or none
    "$bin" tokenize "$data/$n.json" -o t.bin "$data/corpus.txt" $flag >/dev/null || die "$n"
    "$bin" decode "$data/$n.json" t.bin -o back.txt || die "$n decode"
    cmp back.txt "$data/corpus.txt" || die "$n: text does not round trip"
  done
  tok=$data/bytelevel-llama3.json
  "$bin" tokenize "$tok" -o j.bin "$data/corpus.jsonl" >/dev/null || die "jsonl"
  "$bin" decode "$tok" j.bin --format jsonl >back.jsonl || die "jsonl decode"
  cmp back.jsonl "$data/corpus.jsonl" || die "JSONL does not round trip"
  # a whole file as one document, and empty lines kept as empty documents
  printf 'one\n\ntwo  \n\n\nthree' >doc.txt
  "$bin" tokenize "$tok" -o f.bin doc.txt --doc file >/dev/null || die "--doc file"
  [ "$("$bin" decode "$tok" f.bin | wc -l)" = 6 ] || die "--doc file: not one document"
  "$bin" decode "$tok" f.bin >f.txt && printf '\n' >>doc.txt && cmp f.txt doc.txt ||
    die "--doc file does not round trip"
  "$bin" tokenize "$tok" -o e.bin doc.txt --keep-empty >out.txt || die "--keep-empty"
  "$bin" decode "$tok" e.bin >e.txt && cmp e.txt doc.txt || die "--keep-empty does not round trip"
  "$bin" tokenize "$tok" -o s.bin doc.txt >out.txt || die "empty lines"
  grep -q "3 documents (3 empty skipped)" out.txt || die "empty lines: $(cat out.txt)"
  # a JSONL file that starts with a byte-order mark
  printf '\357\273\277{"text": "bom"}\n' >bom.jsonl
  "$bin" tokenize "$tok" -o b.bin bom.jsonl >/dev/null || die "BOM"
  [ "$("$bin" decode "$tok" b.bin)" = bom ] || die "BOM: not skipped"
  echo "tokenize roundtrip: ok"
}

threads() {
  cp "$data/corpus.txt" big.txt
  for _ in 1 2 3 4 5 6 7 8 9 10 11; do cat big.txt big.txt >b2.txt && mv b2.txt big.txt; done
  [ "$(wc -c <big.txt)" -gt 2500000 ] || die "input too small for several chunks"
  for n in bytelevel-llama3 spm-llama2; do
    "$bin" tokenize "$data/$n.json" -o t1.bin big.txt --threads 1 >/dev/null || die "$n 1"
    "$bin" tokenize "$data/$n.json" -o t4.bin big.txt --threads 4 >/dev/null || die "$n 4"
    cmp t1.bin t4.bin && cmp t1.bin.idx t4.bin.idx || die "$n: output depends on the threads"
    # every document's ids equal the small corpus's: chunk cuts never split a document
    "$bin" tokenize "$data/$n.json" -o one.bin "$data/corpus.txt" >/dev/null || die "$n small"
    "$bin" decode "$data/$n.json" one.bin --print-ids >one.txt
    "$bin" decode "$data/$n.json" t4.bin --print-ids | head -n "$(wc -l <one.txt)" >first.txt
    cmp one.txt first.txt || die "$n: the first copy of the corpus differs"
  done
  echo "tokenize threads: ok ($(wc -c <big.txt) bytes)"
}

# expect CODE PATTERN CMD...: the command exits CODE with PATTERN in its output, and leaves
# nothing but the inputs in the directory
expect() {
  code=$1 pat=$2
  shift 2
  before=$(ls | sort)
  out=$("$@" 2>&1)
  got=$?
  [ "$got" = "$code" ] || die "exit $got, not $code: $* -> $out"
  echo "$out" | grep -q -- "$pat" || die "no '$pat' in: $out"
  [ "$(ls | sort)" = "$before" ] || die "files were left: $(ls)"
}

errors() {
  tok=$data/bytelevel-llama3.json
  printf '{"text": "a"}\n\n{"body": "b", "id": 7}\n' >field.jsonl
  expect 2 'field.jsonl:3: no "text" member; name the text.s member with --field (this object has: body id)' \
    "$bin" tokenize "$tok" -o o.bin field.jsonl
  printf '{"text": "a"}\n{"text": "b"\n' >broken.jsonl
  expect 2 'broken.jsonl:2: not valid JSON' "$bin" tokenize "$tok" -o o.bin broken.jsonl
  printf '{"text": 12}\n' >num.jsonl
  expect 2 'num.jsonl:1: "text" is not a string' "$bin" tokenize "$tok" -o o.bin num.jsonl
  printf '{"text": "a\\u0000b"}\n' >nul.jsonl
  expect 2 'nul.jsonl:1: the object holds \\u0000' "$bin" tokenize "$tok" -o o.bin nul.jsonl
  printf 'fine\nab\377cd\n' >bad.txt
  expect 2 'bad.txt:2: not valid UTF-8 at byte 3 (0xFF).*--utf8 replace' \
    "$bin" tokenize "$tok" -o o.bin bad.txt
  expect 2 'missing.txt: cannot open' "$bin" tokenize "$tok" -o o.bin bad.txt missing.txt
  expect 2 'output bad.txt is the input bad.txt' "$bin" tokenize "$tok" -o bad.txt bad.txt
  expect 2 "--eos 'nope' is not a token" "$bin" tokenize "$tok" -o o.bin --eos nope bad.txt
  expect 2 "unknown option '--frobnicate'" "$bin" tokenize "$tok" -o o.bin --frobnicate bad.txt
  printf '{"normalizer": {"type": "NFKC"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}' >nfkc.json
  expect 2 "nfkc.json: normalizer: type 'NFKC' is not supported" \
    "$bin" tokenize nfkc.json -o o.bin bad.txt
  printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}' >noeos.json
  expect 2 'names no EOS token.*give --eos TOKEN, or --eos none' \
    "$bin" tokenize noeos.json -o o.bin bad.txt
  # --utf8 replace: the bad byte becomes U+FFFD
  "$bin" tokenize "$tok" -o r.bin bad.txt --utf8 replace >/dev/null || die "--utf8 replace"
  [ "$("$bin" decode "$tok" r.bin | tail -n 1)" = "ab�cd" ] || die "--utf8 replace: no U+FFFD"
  # an index that does not belong to its token file
  head -c 6 r.bin >cut.bin && cp r.bin.idx cut.bin.idx
  expect 2 'cut.bin: 6 bytes, but its index cut.bin.idx says' "$bin" decode "$tok" cut.bin
  expect 2 'not an index' "$bin" decode "$tok" r.bin --index bad.txt
  expect 2 'id 9999 (position 1) is not a token' "$bin" decode "$tok" --ids "1 9999"
  echo "tokenize errors: ok"
}

"$mode"
