// Encode throughput of the Hugging Face `tokenizers` library (Rust, npm tokenizers@0.23.2) on the text file that
// bench_tokenizer --text-out wrote, in the same two modes: "whole" (one encode call) and "lines" (one call per
// line, its trailing "\n" included), without special tokens, one warm-up then the best of 3 (process.hrtime).
// MB/s = 10^6 bytes of the file per second. Each call is awaited before the next (encode runs on a libuv worker,
// so per-call times include that hand-off and the UTF-16 -> UTF-8 copy of the string; that is the library's cost
// as a Node user sees it).
// Usage: node tokenizer_npm.js TOKENIZER.json[.gz] TEXT_FILE    (with tokenizers on NODE_PATH)
// Output: the same "RESULT mode=... bytes=... tokens=... best_s=... mbps=..." lines as bench_tokenizer.
"use strict";
const fs = require("fs");
const zlib = require("zlib");
const os = require("os");
const path = require("path");
const { Tokenizer } = require("tokenizers");

const RUNS = 3;

async function pass(tok, pieces) {
  let tokens = 0;
  for (const p of pieces) {
    const enc = await tok.encode(p, null, { addSpecialTokens: false });
    tokens += enc.getLength();
  }
  return tokens;
}

function splitLines(text) {
  const out = [];
  let pos = 0;
  while (pos < text.length) {
    const nl = text.indexOf("\n", pos);
    const end = nl < 0 ? text.length : nl + 1;
    out.push(text.slice(pos, end));
    pos = end;
  }
  return out;
}

(async () => {
  if (process.argv.length !== 4) {
    console.error("usage: node tokenizer_npm.js TOKENIZER.json[.gz] TEXT_FILE");
    process.exit(2);
  }
  let file = process.argv[2];
  let tmp = null;
  if (file.endsWith(".gz")) {
    tmp = path.join(os.tmpdir(), "berth-tokbench-" + process.pid + ".json");
    fs.writeFileSync(tmp, zlib.gunzipSync(fs.readFileSync(file)));
    file = tmp;
  }
  const t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(file);
  if (tmp) fs.unlinkSync(tmp);
  const bytes = fs.readFileSync(process.argv[3]);
  const text = bytes.toString("utf8");
  if (Buffer.byteLength(text, "utf8") !== bytes.length) throw new Error(process.argv[3] + ": not valid UTF-8");
  console.log(`tokenizer ${process.argv[2]}: loaded in ${(Number(process.hrtime.bigint() - t0) / 1e9).toFixed(3)} s; text ${bytes.length} bytes`);
  for (const [mode, pieces] of [["whole", [text]], ["lines", splitLines(text)]]) {
    const warm = await pass(tok, pieces);
    let best = Infinity;
    for (let r = 0; r < RUNS; r++) {
      const s = process.hrtime.bigint();
      const n = await pass(tok, pieces);
      const dt = Number(process.hrtime.bigint() - s) / 1e9;
      if (n !== warm) throw new Error(`run ${r} gave ${n} tokens, warm-up gave ${warm}`);
      best = Math.min(best, dt);
    }
    console.log(`RESULT mode=${mode} bytes=${bytes.length} tokens=${warm} best_s=${best.toFixed(4)} mbps=${(bytes.length / best / 1e6).toFixed(2)}`);
  }
})().catch((e) => {
  console.error("tokenizer_npm.js: " + (e && e.stack ? e.stack : e));
  process.exit(1);
});
