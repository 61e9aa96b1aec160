// gen.mjs — writes llama.cpp's tokenizations of random mixed-script text as test vectors:
//   NAME.inp (cases separated by "\n__ggml_vocab_test__\n"), NAME.out (ids per case, each line
//   starting with a space, as llama.cpp's own vectors) and NAME.det (the hex of llama.cpp's
//   detokenisation of those ids).
// Not run by the tests: it needs node and llama.cpp (npm i -E node-llama-cpp@3.21.1, whose
// prebuilt library is llama.cpp of 2026-09-12). Usage:
//   node gen.mjs VOCAB.gguf OUT_PREFIX N_CASES SEED (plain|parse)
// "parse" tokenises with parse_special (and detokenises with special tokens shown).
import {getLlama} from "node-llama-cpp";
import fs from "fs";
const [,, vocabPath, outPrefix, nCases, seedArg, mode] = process.argv;
let seed = Number(seedArg) >>> 0 || 1;
const rnd = () => { seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0; return seed / 4294967296; };
const pick = (a) => a[Math.floor(rnd() * a.length)];
const pools = [
  "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", "0123456789",
  "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", " ", " ", "  ", "\t", "\n", "\r\n", "\n\n",
  "\u00a0\u3000\u2028\u2029\u0085\u200b\u2009\u1680\u202f\u205f\u000b\u000c",
  "áéíóúàèìòùâêîôûäëïöüñçøåæœßÁÉÍÓÚÄÖÜÑ", "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГД",
  "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΩ", "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
  "가나다라마바사아자차카타파하한국어", "あいうえおかきくけこアイウエオカキクケコー", "ا ب ت ث ج ح خ د ذ ر ز",
  "अआइईउऊएऐओऔकखगघ", "กขฃคฅฆงจฉชซฌญฎฏ", "កាន់តែពិសេសអាចខលចេញ", "ＡＢＣａｂｃ１２３！？（）",
  "€£¥©®™°±×÷§¶•…–—‘’“”«»¿¡", "∀∂∈∑∏√∞≈≠≤≥⊂⊃∧∨", "\u0301\u0308\u0327\u20dd",
  "😀😁🦙🚀✅❤️👍🏽👨‍👩‍👧‍👦😶‍🌫️🇺🇸", "ⅠⅡⅢ½¼¾²³", "µºª", "ǅǈǋ", "ᾼῌῼ", "ႠႡႢაბგ", "ⰀⰁⰂ",
  "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'RE", "'Ll",
];
const words = ["the", "The", " quick", "brown", "fox", "don't", "I'm", "we'll", "they've",
  "Hello", "world", "function", "return", "int", "main", "void", "2024", "3.14159", "1,000,000",
  "http://example.com/a?b=c", "foo_bar", "camelCase", "x+=1;", "    ", "\t\t", "\n\n\n", "...", "!!!", "???",
  "<|endoftext|>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<fim_prefix>", "[PAD32000]", "<|end|>",
  "<｜end▁of▁sentence｜>", ">>TITLE<<", "<|padding|>", "\u2581", "\u2581\u2581hi", "Ġ", "ĊĠ"];
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: vocabPath, vocabOnly: true});
const cases = [];
for (let i = 0; i < Number(nCases); i++) {
  let s = "";
  const n = 1 + Math.floor(rnd() * 12);
  for (let k = 0; k < n; k++) {
    if (rnd() < 0.35) { s += pick(words); if (rnd() < 0.5) s += " "; continue; }
    const p = pick(pools); const m = 1 + Math.floor(rnd() * 4);
    if (p.length <= 4 && p[0] === "'") { s += p; continue; }
    const chars = Array.from(p);
    for (let j = 0; j < m; j++) s += pick(chars);
  }
  cases.push(s);
}
let out = "", det = "";
for (const s of cases) {
  const t = model.tokenize(s, mode === "parse");
  out += Array.from(t).map((x) => " " + x).join("") + "\n";
  det += Buffer.from(model.detokenize(Array.from(t), mode === "parse"), "utf8").toString("hex") + "\n";
}
fs.writeFileSync(outPrefix + ".inp", cases.join("\n__ggml_vocab_test__\n") + "\n__ggml_vocab_test__\n");
fs.writeFileSync(outPrefix + ".out", out);
fs.writeFileSync(outPrefix + ".det", det);
