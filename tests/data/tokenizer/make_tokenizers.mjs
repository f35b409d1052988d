// Builds the small tokenizer.json files the tokenizer tests use, one per family Llama models
// ship, by training byte-pair merges on examples/data/tessera-docs.txt and a few multilingual
// lines. Deterministic (ties go to the smallest pair), so a rerun writes the same files.
// Plain Node.js, no packages:  node tests/data/tokenizer/make_tokenizers.mjs
//
//   bytelevel-llama3.json  byte-level BPE, Llama 3 layout: Split on the Llama 3 regex then
//                          ByteLevel, ignore_merges, BOS from a TemplateProcessing, merges as pairs
//   bytelevel-gpt2.json    byte-level BPE, GPT-2 layout: the ByteLevel pre-tokenizer's own regex,
//                          no BOS, merges as "a b" strings, an lstrip added token
//   spm-llama2.json        SentencePiece-style BPE, Llama 2 layout: Prepend + Replace normalizer,
//                          byte fallback <0x00>..<0xFF>, fused <unk>, BOS, Replace/ByteFallback/
//                          Fuse/Strip decoder
//   spm-metaspace.json     the same model in the newer layout: a Metaspace pre-tokenizer
//                          (prepend_scheme first, no split) instead of the normalizer
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..", "..");
const extra = [
  "Tokenizers split text into pieces; the model never sees characters, only ids.",
  "Der schnelle braune Fuchs springt über den faulen Hund. Ça coûte très cher, n'est-ce pas?",
  "El niño comió una manzana. São Paulo é uma cidade grande. Zażółć gęślą jaźń.",
  "機械学習のモデルはデータから学ぶ。東京は日本の首都です。自然言語処理。",
  "深度学习模型需要大量的数据和计算资源。我们在北京和上海都有办公室。",
  "한국어 문장도 토큰으로 나뉩니다. 서울은 한국의 수도입니다.",
  "Привет, мир! Москва — столица России. Ελληνικά γράμματα: αβγδε.",
  "The year 2024 had 366 days; 3.14159 and 1,000,000 are numbers.",
];
const text = readFileSync(join(root, "examples/data/tessera-docs.txt"), "utf8") + "\n" +
  extra.join("\n") + "\n";

// GPT-2's map from bytes to printable characters.
const byteChars = (() => {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++)
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  const order = bs.map((b, i) => [b, String.fromCharCode(cs[i])]);
  return { order, map: Object.fromEntries(order) };
})();

// Counts of words (arrays of symbols) -> `count` merges, most frequent pair first; a tie goes to
// the pair whose joined strings sort first, so the result does not depend on map order.
function trainMerges(words, count) {
  const entries = [...words.entries()].map(([w, c]) => ({ syms: [...w.split("\u0000")], c }));
  const merges = [];
  for (let m = 0; m < count; m++) {
    const pairs = new Map();
    for (const e of entries)
      for (let i = 0; i + 1 < e.syms.length; i++) {
        const k = e.syms[i] + "\u0000" + e.syms[i + 1];
        pairs.set(k, (pairs.get(k) ?? 0) + e.c);
      }
    let best = null, bestC = 0;
    for (const [k, c] of pairs)
      if (c > bestC || (c === bestC && k < best)) (best = k), (bestC = c);
    if (!best || bestC < 2) break;
    const [a, b] = best.split("\u0000");
    merges.push([a, b]);
    for (const e of entries) {
      const out = [];
      for (let i = 0; i < e.syms.length; i++)
        if (i + 1 < e.syms.length && e.syms[i] === a && e.syms[i + 1] === b) out.push(a + b), i++;
        else out.push(e.syms[i]);
      e.syms = out;
    }
  }
  return merges;
}

function countWords(pieces, toSyms) {
  const words = new Map();
  for (const p of pieces) {
    const k = toSyms(p).join("\u0000");
    words.set(k, (words.get(k) ?? 0) + 1);
  }
  return words;
}

const LLAMA3_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// The same pattern in JavaScript syntax, for training only ((?i:) is not JavaScript).
const llama3Js =
  /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;

function byteLevel() {
  const enc = new TextEncoder();
  const toSyms = (s) => [...enc.encode(s)].map((b) => byteChars.map[b]);
  const merges = trainMerges(countWords(text.match(llama3Js), toSyms), 500);
  const vocab = {};
  let id = 0;
  for (const [, ch] of byteChars.order) vocab[ch] = id++;
  for (const [a, b] of merges) if (!(a + b in vocab)) vocab[a + b] = id++;
  return { vocab, merges, next: id };
}

function added(id, content, special, extra = {}) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: !special,
           special, ...extra };
}

const byteDecoder = { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true };

function writeJson(name, obj) {
  writeFileSync(join(here, name), JSON.stringify(obj, null, 1) + "\n");
  console.log(`wrote ${name}`);
}

function llama3(bl) {
  let id = bl.next;
  const specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                    "<|end_header_id|>", "<|eot_id|>"].map((c) => added(id++, c, true));
  specials.forEach((t) => (t.normalized = false));
  writeJson("bytelevel-llama3.json", {
    version: "1.0", truncation: null, padding: null, added_tokens: specials, normalizer: null,
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: LLAMA3_SPLIT }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: "Sequence", processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      { type: "TemplateProcessing",
        single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
                 { Sequence: { id: "A", type_id: 0 } }],
        pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
               { Sequence: { id: "A", type_id: 0 } },
               { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } },
               { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [specials[0].id],
                                                 tokens: ["<|begin_of_text|>"] } } }] },
    decoder: byteDecoder,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
             vocab: bl.vocab, merges: bl.merges },
  });
}

function gpt2(bl) {
  let id = bl.next;
  const toks = [added(id++, "<|endoftext|>", true), added(id++, "<mask>", true, { lstrip: true })];
  toks[0].normalized = true; // as GPT-2's file has it
  writeJson("bytelevel-gpt2.json", {
    version: "1.0", truncation: null, padding: null, added_tokens: toks, normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: byteDecoder,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
             end_of_word_suffix: "", fuse_unk: false, vocab: bl.vocab,
             merges: bl.merges.map(([a, b]) => `${a} ${b}`) },
  });
}

function sentencePiece() {
  const lines = text.split("\n").filter((l) => l.length > 0);
  const pieces = [];
  for (const l of lines) pieces.push(...("\u2581" + l.replaceAll(" ", "\u2581")).match(/\u2581[^\u2581]*|[^\u2581]+/gu));
  // Characters seen at least 3 times are pieces; the rest reach the model as bytes.
  const freq = new Map();
  for (const p of pieces) for (const ch of p) freq.set(ch, (freq.get(ch) ?? 0) + 1);
  const chars = [...freq.entries()].filter(([, c]) => c >= 3).map(([ch]) => ch).sort();
  const known = new Set(chars);
  // Merges are trained within runs of known characters only, as SentencePiece never merges
  // across a byte-fallback character.
  const runs = [];
  for (const p of pieces) runs.push(...p.split(/(.)/u).filter((s) => s.length).reduce((acc, ch) => {
    if (known.has(ch)) acc[acc.length - 1] += ch; else acc.push("");
    return acc;
  }, [""]).filter((s) => [...s].length > 1));
  const merges = trainMerges(countWords(runs, (s) => [...s]), 400);
  const vocab = { "<unk>": 0, "<s>": 1, "</s>": 2 };
  let id = 3;
  for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = id++;
  for (const ch of chars) if (!(ch in vocab)) vocab[ch] = id++;
  for (const [a, b] of merges) if (!(a + b in vocab)) vocab[a + b] = id++;
  const specials = [added(0, "<unk>", true), added(1, "<s>", true), added(2, "</s>", true)];
  specials.forEach((t) => (t.normalized = false));
  const post = {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
           { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
  };
  const decoder = { type: "Sequence", decoders: [
    { type: "Replace", pattern: { String: "\u2581" }, content: " " }, { type: "ByteFallback" },
    { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }] };
  const model = { type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null,
                  end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, vocab,
                  merges: merges.map(([a, b]) => `${a} ${b}`) };
  writeJson("spm-llama2.json", {
    version: "1.0", truncation: null, padding: null, added_tokens: specials,
    normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "\u2581" },
      { type: "Replace", pattern: { String: " " }, content: "\u2581" }] },
    pre_tokenizer: null, post_processor: post, decoder, model,
  });
  writeJson("spm-metaspace.json", {
    version: "1.0", truncation: null, padding: null, added_tokens: specials, normalizer: null,
    pre_tokenizer: { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false },
    post_processor: post, decoder, model: { ...model, merges: merges },
  });
}

const bl = byteLevel();
llama3(bl);
gpt2(bl);
sentencePiece();
