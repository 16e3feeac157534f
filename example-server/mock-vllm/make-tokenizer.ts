/**
 * npx tsx example-server/mock-vllm/make-tokenizer.ts [OUT_DIR]
 *
 * Writes the mock's tokenizer (example-server/mock-vllm/tokenizer/): a byte-level BPE shaped
 * like Llama 3's (the same pre-tokenizer regex, ByteLevel bytes-to-characters alphabet,
 * decoder, and a post-processor that puts `<|begin_of_text|>` first), with a tiny vocabulary
 * trained here: the 256 byte characters plus MERGES merges learnt by plain BPE (most frequent
 * adjacent pair first, ties broken by the pair's text) on CORPUS below, and Llama 3's five chat
 * special tokens. Its `tokenizer_config.json` carries a Llama-3-style chat template. The
 * output is deterministic: running this again must leave the files unchanged.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const MERGES = 320;
const OUT = join(__dirname, 'tokenizer');

// Llama 3's split pattern, as tokenizer.json spells it (Oniguruma syntax) ...
const SPLIT_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// ... and the same in JavaScript for training (Node 20 has no inline `(?i:...)`).
const SPLIT_JS = /'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;

const SPECIAL_TOKENS = ['<|begin_of_text|>', '<|end_of_text|>', '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>'];

const CORPUS = `
You are a helpful assistant. Answer the user's questions briefly and accurately.
The router sends each request to the data-parallel rank whose prefix cache already holds the
longest part of its prompt, so the engine can skip prefill for the tokens it has seen before.
A system prompt shared by many requests is the common case: the same instructions, the same
documents, the same tools, followed by a short question from the user. When the cache of one
rank fills up, the engine evicts the least recently used blocks and reports their removal.
What is the capital of France? The capital of France is Paris. How many tokens are in this
prompt? Count them with the model's own tokenizer, then compare with the server's answer.
Please summarize the following document in three sentences, and list the key points.
user assistant system tool function arguments content role message messages request response
the of and to in is that for it with as was on be by this are or from at an which have not
0 1 2 3 4 5 6 7 8 9 10 16 32 64 100 128 256 512 1024 2048 4096 8192 2026 12:30 3.14 50%
def main(): return {"key": "value", "list": [1, 2, 3]} // comment; if (x > 0) { y = x * 2; }
`;

/** GPT-2's reversible map from bytes to printable characters, which ByteLevel uses. */
function byteAlphabet(): string[] {
  const printable: number[] = [];
  for (let b = 33; b <= 126; b++) printable.push(b);
  for (let b = 161; b <= 172; b++) printable.push(b);
  for (let b = 174; b <= 255; b++) printable.push(b);
  const chars = new Array<string>(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) chars[b] = String.fromCodePoint(printable.includes(b) ? b : 256 + extra++);
  return chars;
}

function train(): { vocab: Record<string, number>; merges: string[] } {
  const alphabet = byteAlphabet();
  const vocab: Record<string, number> = {};
  // Byte order, as the ByteLevel alphabet is usually listed.
  for (const char of [...alphabet].sort((a, b) => a.codePointAt(0)! - b.codePointAt(0)!)) vocab[char] = Object.keys(vocab).length;

  const wordCounts = new Map<string, number>();
  for (const word of CORPUS.match(SPLIT_JS) ?? []) {
    const mapped = [...Buffer.from(word, 'utf8')].map((b) => alphabet[b]).join('\u0000');
    wordCounts.set(mapped, (wordCounts.get(mapped) ?? 0) + 1);
  }
  let words = [...wordCounts].map(([symbols, count]) => ({ symbols: symbols.split('\u0000'), count }));
  const merges: string[] = [];
  while (merges.length < MERGES) {
    const pairs = new Map<string, number>();
    for (const { symbols, count } of words) {
      for (let i = 0; i + 1 < symbols.length; i++) {
        const pair = `${symbols[i]} ${symbols[i + 1]}`;
        pairs.set(pair, (pairs.get(pair) ?? 0) + count);
      }
    }
    let best: string | undefined;
    let bestCount = 1;
    for (const [pair, count] of pairs) {
      if (count > bestCount || (count === bestCount && best !== undefined && pair < best)) [best, bestCount] = [pair, count];
    }
    if (best === undefined) break;
    const [left, right] = best.split(' ');
    merges.push(best);
    vocab[left + right] = Object.keys(vocab).length;
    words = words.map(({ symbols, count }) => {
      const out: string[] = [];
      for (let i = 0; i < symbols.length; i++) {
        if (i + 1 < symbols.length && symbols[i] === left && symbols[i + 1] === right) out.push(left + symbols[++i]);
        else out.push(symbols[i]);
      }
      return { symbols: out, count };
    });
  }
  return { vocab, merges };
}

function tokenizerJson(): object {
  const { vocab, merges } = train();
  const base = Object.keys(vocab).length;
  const added = SPECIAL_TOKENS.map((content, i) => ({ id: base + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
  const bos = { id: SPECIAL_TOKENS[0], ids: [base], tokens: [SPECIAL_TOKENS[0]] };
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: SPLIT_PATTERN }, behavior: 'Isolated', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    post_processor: {
      type: 'Sequence',
      processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        {
          type: 'TemplateProcessing',
          single: [{ SpecialToken: { id: SPECIAL_TOKENS[0], type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
          pair: [
            { SpecialToken: { id: SPECIAL_TOKENS[0], type_id: 0 } },
            { Sequence: { id: 'A', type_id: 0 } },
            { SpecialToken: { id: SPECIAL_TOKENS[0], type_id: 1 } },
            { Sequence: { id: 'B', type_id: 1 } },
          ],
          special_tokens: { [SPECIAL_TOKENS[0]]: bos },
        },
      ],
    },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: true,
      vocab,
      merges,
    },
  };
}

// Llama 3's template, less its tool and date handling.
const CHAT_TEMPLATE =
  "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

function tokenizerConfig(): object {
  return {
    bos_token: SPECIAL_TOKENS[0],
    eos_token: '<|eot_id|>',
    clean_up_tokenization_spaces: true,
    model_max_length: 131072,
    tokenizer_class: 'PreTrainedTokenizerFast',
    chat_template: CHAT_TEMPLATE,
  };
}

/** The two files' text, as written to the fixture directory. */
export function makeTokenizerFiles(): { 'tokenizer.json': string; 'tokenizer_config.json': string } {
  return {
    'tokenizer.json': `${JSON.stringify(tokenizerJson(), null, 1)}\n`,
    'tokenizer_config.json': `${JSON.stringify(tokenizerConfig(), null, 2)}\n`,
  };
}

if (require.main === module) {
  const out = process.argv[2] ?? OUT;
  mkdirSync(out, { recursive: true });
  for (const [name, text] of Object.entries(makeTokenizerFiles())) writeFileSync(join(out, name), text);
}
