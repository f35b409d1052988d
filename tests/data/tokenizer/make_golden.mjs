// Golden token ids for the tokenizer tests, made once by an independent implementation of
// Hugging Face tokenizers: the JavaScript port @huggingface/tokenizers (0.2.0), installed outside
// the tree. Tests and CI only read what this script wrote; they never run it.
//
//   npm install --prefix /tmp/tokref @huggingface/tokenizers@0.2.0
//   NODE_PATH=/tmp/tokref/node_modules node tests/data/tokenizer/make_golden.mjs
//
// Writes, beside this script:
//   corpus.jsonl            the corpus, one {"text": ...} object per document
//   corpus.txt              its documents without a line break, one per line (round trips)
//   NAME.golden.jsonl       per tokenizer and document: the text, its ids with the tokenizer's
//                           special tokens (add_special_tokens), without them (ids_plain), and
//                           the decoding of ids_plain without clean-up (decoded)
//   NAME.stream.txt         the ids `tessera tokenize` writes for corpus.jsonl, one document per
//                           line: the ids with special tokens, then the EOS token
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("@huggingface/tokenizers");
const here = dirname(fileURLToPath(import.meta.url));

const corpus = [
  // ASCII prose, contractions in both cases, punctuation
  "Hello world! This is Tessera, a trainer for Llama models written in C.",
  "We're sure it's fine; they'll say I'd've known. DON'T SHOUT, I'M HERE, YOU'LL SEE.",
  "The quick brown fox jumps over the lazy dog... (really?) [yes] {no} <maybe> \"quoted\" 'single'",
  "tsr_tokenizer_load(path, &tok); if (s != TSR_OK) return s; // a line of C",
  "https://example.com/a/b?c=d&e=f#frag -- email: someone@example.org",
  // digits
  "0 1 12 123 1234 12345 123456789 3.14159 -42 +7 1,000,000 2024-01-31 10:45:00",
  "Numbers in other scripts: ١٢٣٤ (Arabic-Indic), ४२ (Devanagari), ½ ² ³ and Ⅻ.",
  // whitespace runs
  "two  spaces, three   spaces,\ttab,\t\ttwo tabs,    four spaces",
  "trailing spaces   ",
  "   leading spaces",
  "line one\nline two\n\nafter a blank line\r\nwindows line\rold mac",
  "no\u00a0break\u00a0space, ideographic\u3000space, thin\u2009space, line\u2028separator",
  " ",
  "\n\n\n",
  "\t \t",
  // CJK
  "機械学習のモデルはデータから学ぶ。東京は日本の首都です。",
  "深度学习模型需要大量的数据。我们在北京。",
  "한국어 문장도 토큰으로 나뉩니다. 서울은 한국의 수도입니다.",
  "ひらがなとカタカナ、そして漢字。ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３",
  // emoji: single, skin tone, ZWJ family, flags, keycap, variation selector
  "I ❤️ tokenizers 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇯🇵🇫🇷 1️⃣ ☕ 🦀🐍",
  "emoji glued to words: hi😀there, 🚀launch, end🎉",
  // combining marks and other scripts
  "cafe\u0301 vs café, n\u0303 vs ñ, a\u0308\u0301 stacked, Z\u0351\u0352\u0353algo",
  "Tiếng Việt có nhiều dấu: Hà Nội, thành phố Hồ Chí Minh.",
  "हिन्दी में लिखा हुआ पाठ। العربية تكتب من اليمين إلى اليسار. עברית גם.",
  "Привет, мир! Ελληνικά: αβγδε. Zażółć gęślą jaźń. Straße, ŒUVRE, ǅ, ﬁ ligature.",
  // special tokens written in the text (each tokenizer knows some of these)
  "before<|end_of_text|>after <|begin_of_text|> spaced <|eot_id|>",
  "gpt2 style<|endoftext|>next document <mask> masked   <mask>end",
  "llama style <s> in text </s> and <unk> too",
  "<s>starts with a special token",
  "ends with a special token</s>",
  // bytes that need a fallback in the small vocabularies
  "rare: ∮ ∯ ⨌ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 and private use \ue000",
  "control characters: \u0001\u0002\u001f end",
  // a longer paragraph
  "A save writes both files completely to temporaries beside them, and fsyncs them: a full " +
    "disk, an error or a kill here leaves the previous checkpoint as it was. It then renames the " +
    "optimizer file into place: this is the commit point. Finally it renames the model file.",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbb ________________ ----",
];

const eosOf = {
  "bytelevel-llama3": "<|end_of_text|>",
  "bytelevel-gpt2": "<|endoftext|>",
  "spm-llama2": "</s>",
  "spm-metaspace": "</s>",
};

writeFileSync(join(here, "corpus.jsonl"), corpus.map((text) => JSON.stringify({ text })).join("\n") + "\n");
writeFileSync(join(here, "corpus.txt"),
  corpus.filter((t) => !/[\n\r]/.test(t) && t.length > 0).join("\n") + "\n");

for (const [name, eos] of Object.entries(eosOf)) {
  const json = JSON.parse(readFileSync(join(here, `${name}.json`), "utf8"));
  const tok = new Tokenizer(json, {});
  const eosId = tok.token_to_id(eos);
  if (eosId === undefined) throw new Error(`${name}: no ${eos}`);
  const golden = [];
  const stream = [];
  for (const text of corpus) {
    const ids = tok.encode(text).ids;
    const ids_plain = tok.encode(text, { add_special_tokens: false }).ids;
    const decoded = ids_plain.length
      ? tok.decode(ids_plain, { clean_up_tokenization_spaces: false })
      : "";
    golden.push(JSON.stringify({ text, ids, ids_plain, decoded }));
    stream.push([...ids, eosId].join(" "));
  }
  writeFileSync(join(here, `${name}.golden.jsonl`), golden.join("\n") + "\n");
  writeFileSync(join(here, `${name}.stream.txt`), stream.join("\n") + "\n");
  console.log(`wrote ${name}.golden.jsonl and ${name}.stream.txt (${corpus.length} documents)`);
}
