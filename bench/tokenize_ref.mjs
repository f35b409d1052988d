// The reference side of bench/compare_tokenize.sh: the JavaScript port of Hugging Face
// tokenizers (@huggingface/tokenizers, on NODE_PATH) encodes every non-empty line of INPUT as one
// document, as `tessera tokenize` does, and prints its speed. With IDS it also writes each
// document's ids followed by the EOS id, one document per line, the format of
// `tessera decode --print-ids`, so the script can check that both produced the same ids.
//
//   node bench/tokenize_ref.mjs TOKENIZER.json INPUT EOS [IDS]
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("@huggingface/tokenizers");
const [tokPath, input, eos, idsPath] = process.argv.slice(2);
const tok = new Tokenizer(JSON.parse(readFileSync(tokPath, "utf8")), {});
const eosId = tok.token_to_id(eos);
const raw = readFileSync(input);
const docs = raw.toString("utf8").split("\n").map((l) => (l.endsWith("\r") ? l.slice(0, -1) : l))
  .filter((l) => l.length > 0);

const cpu0 = process.cpuUsage();
const t0 = process.hrtime.bigint();
const out = [];
let tokens = 0;
for (const d of docs) {
  const ids = tok.encode(d).ids;
  tokens += ids.length + 1;
  if (idsPath) out.push(ids);
}
const wall = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu = process.cpuUsage(cpu0);
const cpuS = (cpu.user + cpu.system) / 1e6;
if (idsPath) writeFileSync(idsPath, out.map((ids) => [...ids, eosId].join(" ")).join("\n") + "\n");
const mb = raw.length / 1e6;
console.log(`reference docs=${docs.length} tokens=${tokens} wall_s=${wall.toFixed(3)} ` +
  `cpu_s=${cpuS.toFixed(3)} mb_per_s=${(mb / wall).toFixed(2)} mb_per_cpu_s=${(mb / cpuS).toFixed(2)}`);
