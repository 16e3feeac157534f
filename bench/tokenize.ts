/**
 * npx tsx bench/tokenize.ts [--tokenizer DIR] [--rust PATH] [--quick]
 *
 * What tokenizing requests in the router costs, timed in this process's CPU time (and wall
 * time where another thread or process does the work):
 * - the libraries: load time and one whole-text encode of a 2k- and an 8k-token text with
 *   `@huggingface/tokenizers` (pure JS, synchronous) and, given `--rust PATH` (a directory
 *   where the `tokenizers` npm package is installed, e.g. /tmp/tokbench/node_modules/tokenizers),
 *   the Rust-backed `tokenizers` (asynchronous, on libuv's thread pool), and whether they agree;
 * - `PromptTokenizer` + `KvExactIndex.match()` per chat request of 2k and 8k tokens: cold (a
 *   system prompt never seen), warm (the system prompt seen before, a new user message of
 *   about 60 tokens), and repeated (the same request again);
 * - `PromptTokenizer.tokenize('completions')` per request of an 8 KB prompt: cold, and sharing
 *   all but a new 48-character tail with the one before (cut between words, chunks cached);
 * - the new-text budget `maxUncachedChars` (32,768 UTF-8 bytes) spent whole in one request:
 *   English-like prose, CJK prose with its punctuation, and a CJK run with none (one
 *   pre-tokenizer word), with the library alone and through `PromptTokenizer`, and 32,768 CJK
 *   characters (three budgets: refused, then taken in over a few requests and cached);
 * - a chat request of 1,024 new 12-byte messages (the most rendered; with the 16 bytes each is
 *   charged for rendering, the budget spent whole), its template rendered and tokenized;
 * - `tokenizer: 'upstream'`: a round trip to the embedded mock's `/tokenize` per request.
 *
 * `--tokenizer` defaults to the mock's fixture (a 400-token vocabulary, so its texts run to
 * about 2.5 characters a token); a real model's directory (tokenizer.json +
 * tokenizer_config.json) gives the figures that matter.
 */
import { performance } from 'node:perf_hooks';
import { startMockVllm } from '../example-server/mock-vllm';
import { MOCK_TOKENIZER_DIR } from '../example-server/mock-vllm/tokenize';
import { KvExactIndex } from '../lib/exact-prefix/index/exact-index';
import { loadTokenizersPackage, readTokenizerFiles } from '../lib/exact-prefix/tokenizer/tokenizer-files';
import { PromptTokenizer } from '../lib/exact-prefix/tokenizer/tokenizer';
import { TokenizerAgreement } from '../lib/exact-prefix/tokenizer/tokenizer-agreement';
import { fixed, markdownTable, median, parseArgs } from './lib/stats';

const args = parseArgs(process.argv.slice(2));
const QUICK = args.has('quick');
const DIR = typeof args.get('tokenizer') === 'string' ? (args.get('tokenizer') as string) : MOCK_TOKENIZER_DIR;
const RUST = args.get('rust');
const SIZES = [2048, 8192];
const RUNS = QUICK ? 5 : 21;
const CJK = '的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长';

function cpuMs(): number {
  const usage = process.cpuUsage();
  return (usage.user + usage.system) / 1000;
}

/** Seeded text that reads like prose: a Zipf-ish draw from made-up words, digits and punctuation. */
function prose(seed: number, chars: number): string {
  let state = seed * 2654435761 + 1;
  const next = () => ((state = (Math.imul(state, 1103515245) + 12345) >>> 0) / 2 ** 32);
  const syllables = ['ka', 'to', 'ren', 'mi', 'sa', 'lo', 'the', 'ing', 'tion', 'er', 'an', 'pre', 'fix', 'rout', 'cache', 'blo', 'ck', 'el', 'un', 'str'];
  const words = Array.from({ length: 3000 }, (_, i) => {
    let word = '';
    for (let s = 0, n = 1 + (i % 4); s < n; s++) word += syllables[(i * 7 + s * 13 + (i >> 3)) % syllables.length];
    return word;
  });
  let text = '';
  while (text.length < chars) {
    const r = next();
    const word = words[Math.floor(words.length * r * r * r)];
    text += next() < 0.05 ? ` ${Math.floor(next() * 10000)}` : ` ${word}`;
    const p = next();
    if (p < 0.06) text += '.';
    else if (p < 0.09) text += ',';
    else if (p < 0.1) text += '\n\n';
  }
  return text.slice(0, chars);
}

function timeCpu<T>(run: () => T): { ms: number; value: T } {
  const start = cpuMs();
  const value = run();
  return { ms: cpuMs() - start, value };
}

async function main(): Promise<void> {
  const files = readTokenizerFiles(DIR);
  const out: string[] = [`# Tokenizing requests\n\ntokenizer: ${DIR}\n`];

  // The libraries.
  const { Tokenizer } = loadTokenizersPackage();
  let start = performance.now();
  const js = new Tokenizer(files.tokenizer, files.config);
  const jsLoadMs = performance.now() - start;
  const charsPerToken = 20_000 / js.encode(prose(1, 20_000), { add_special_tokens: false }).ids.length;
  const texts = SIZES.map((tokens) => Array.from({ length: RUNS + 1 }, (_, i) => prose(100 + i, Math.round(tokens * charsPerToken))));
  const libRows: string[][] = [];
  for (const [s, tokens] of SIZES.entries()) {
    const times = texts[s].slice(1).map((text) => timeCpu(() => js.encode(text, { add_special_tokens: false })).ms);
    js.encode(texts[s][0], { add_special_tokens: false });
    libRows.push([`@huggingface/tokenizers 0.2 (JS)`, `${tokens}`, fixed(median(times), 2), fixed(Math.max(...times), 2), '']);
  }
  let rustLoadMs: number | undefined;
  if (typeof RUST === 'string') {
    const rust = require(RUST) as { Tokenizer: { fromString(json: string): { encode(text: string, pair: null, options: { addSpecialTokens: boolean }): Promise<{ getIds(): number[] }> } } };
    start = performance.now();
    const native = rust.Tokenizer.fromString(JSON.stringify(files.tokenizer));
    rustLoadMs = performance.now() - start;
    for (const [s, tokens] of SIZES.entries()) {
      const wall: number[] = [];
      const cpu: number[] = [];
      let agree = 0;
      for (const text of texts[s].slice(1)) {
        const cpuStart = cpuMs();
        const wallStart = performance.now();
        const ids = (await native.encode(text, null, { addSpecialTokens: false })).getIds();
        wall.push(performance.now() - wallStart);
        cpu.push(cpuMs() - cpuStart);
        const mine = js.encode(text, { add_special_tokens: false }).ids;
        if (ids.length === mine.length && ids.every((id, i) => id === mine[i])) agree++;
      }
      libRows.push([`tokenizers 0.23 (Rust, async)`, `${tokens}`, `${fixed(median(cpu), 2)} (wall ${fixed(median(wall), 2)})`, fixed(Math.max(...cpu), 2), `${agree}/${texts[s].length - 1}`]);
    }
  }
  out.push(`## Libraries: one whole-text encode\n\nload: JS ${fixed(jsLoadMs, 0)} ms${rustLoadMs === undefined ? '' : `, Rust ${fixed(rustLoadMs, 0)} ms`}\n`);
  out.push(markdownTable(['library', 'tokens', 'median ms CPU', 'max ms', 'ids equal to JS'], libRows));

  // PromptTokenizer + lookup, per request.
  // Steady state: past the first requests, which are also tokenized whole to check the cuts.
  const tokenizer = new PromptTokenizer(files, { selfCheckRequests: 0 });
  const index = new KvExactIndex({ ranks: [0, 1, 2, 3, 4, 5, 6, 7] });
  const rows: string[][] = [];
  for (const [s, tokens] of SIZES.entries()) {
    const user = (i: number) => ({ role: 'user', content: prose(9000 + i + s * 1000, Math.round(60 * charsPerToken)) });
    const chat = (system: string, i: number) => ({ messages: [{ role: 'system', content: system }, user(i)] });
    const perRequest = (body: Record<string, unknown>) =>
      timeCpu(() => {
        const outcome = tokenizer.tokenize('chat', body);
        if ('refused' in outcome) throw new Error(outcome.refused);
        index.match(outcome.prompts[0]);
        return outcome.prompts[0].length;
      });
    // Hold the shared prompt on one rank, so the lookup walks all its blocks.
    const shared = texts[s][0];
    const sharedTokens = tokenizer.tokenize('chat', chat(shared, 0));
    if ('refused' in sharedTokens) throw new Error(sharedTokens.refused);
    const ids = sharedTokens.prompts[0];
    const blocks = Math.floor(ids.length / 16);
    index.applyEvent(3, { type: 'stored', blockHashes: Array.from({ length: blocks }, (_, b) => s * 1e6 + b), parentBlockHash: null, tokenIds: ids.slice(0, blocks * 16), blockSize: 16, loraId: null, loraName: null, medium: null, extraKeyed: null, groupIdx: null });

    const cold = texts[s].slice(1).map((system, i) => perRequest(chat(system, i)));
    const warm = Array.from({ length: RUNS }, (_, i) => perRequest(chat(shared, 100 + i)));
    const repeated = Array.from({ length: RUNS }, () => perRequest(chat(shared, 100)));
    const count = cold[0].value;
    for (const [name, samples] of [['cold: system prompt never seen', cold], ['warm: system prompt seen, new user message', warm], ['repeated: the same request again', repeated]] as const) {
      const ms = samples.map((sample) => sample.ms);
      rows.push([`${tokens} (${count})`, name, fixed(median(ms), 3), fixed(Math.max(...ms), 3)]);
    }
  }
  out.push(`\n## PromptTokenizer.tokenize('chat') + KvExactIndex.match() over 8 ranks, per request\n`);
  out.push(markdownTable(['prompt tokens (measured)', 'case', 'median ms CPU', 'max ms'], rows));
  out.push(`\ncache after the run: ${JSON.stringify(tokenizer.stats())}\n`);

  out.push(completionsRows(files, charsPerToken));
  out.push(budgetRows(files, js));

  // The upstream's /tokenize instead: a round trip per request.
  const mock = await startMockVllm({ dataParallelSize: 1 });
  try {
    const agreement = new TokenizerAgreement({ url: mock.url });
    const rtRows: string[][] = [];
    for (const [s, tokens] of SIZES.entries()) {
      const wall: number[] = [];
      const cpu: number[] = [];
      for (let i = 0; i < RUNS; i++) {
        const body = { messages: [{ role: 'system', content: texts[s][0] }, { role: 'user', content: `question ${i}` }] };
        const cpuStart = cpuMs();
        const wallStart = performance.now();
        // check() is the same POST the 'upstream' mode would make for every request (its CPU includes the mock's, in this process).
        const result = await agreement.check('chat', body, []);
        wall.push(performance.now() - wallStart);
        cpu.push(cpuMs() - cpuStart);
        if (!result) throw new Error('/tokenize failed');
      }
      rtRows.push([`${tokens}`, fixed(median(wall), 2), fixed(Math.max(...wall), 2), fixed(median(cpu), 2)]);
    }
    out.push(`\n## tokenizer: 'upstream' — a /tokenize round trip per request (mock on loopback, its tokenizer cached)\n`);
    out.push(markdownTable(['prompt tokens', 'median ms wall', 'max ms wall', 'median ms CPU (router + mock)'], rtRows));
  } finally {
    await mock.close();
  }
  process.stdout.write(`${out.join('\n')}\n`);
}


/** An 8 KB completions prompt: cold, then again with a new 48-character tail each time. */
function completionsRows(files: ReturnType<typeof readTokenizerFiles>, charsPerToken: number): string {
  const tokenizer = new PromptTokenizer(files, { selfCheckRequests: 0 });
  const shared = prose(77, 8192 - 48);
  const tail = (i: number) => ` question ${i}: what comes next`.padEnd(48, ' and then');
  const run = (text: string) =>
    timeCpu(() => {
      const outcome = tokenizer.tokenize('completions', { prompt: text });
      if ('refused' in outcome) throw new Error(outcome.refused);
      return outcome.prompts[0].length;
    });
  const cold = Array.from({ length: RUNS }, (_, i) => run(prose(500 + i, 8192)));
  run(shared + tail(0));
  const warm = Array.from({ length: RUNS }, (_, i) => run(shared + tail(1 + i)));
  const rows = [
    ['cold: a prompt never seen', cold],
    ['shared: the same 8,144 characters, a new 48-character tail', warm],
  ].map(([name, samples]) => {
    const ms = (samples as Array<{ ms: number }>).map((sample) => sample.ms);
    return [`8192 (${Math.round(8192 / charsPerToken)})`, name as string, fixed(median(ms), 3), fixed(Math.max(...ms), 3)];
  });
  return `\n## PromptTokenizer.tokenize('completions'), per request\n\n${markdownTable(['prompt chars (≈ tokens)', 'case', 'median ms CPU', 'max ms'], rows)}\n\ncache after the run: ${JSON.stringify(tokenizer.stats())}\n`;
}


/** Seeded CJK text: with punctuation every ~17 characters (prose), or none (one long word to the pre-tokenizer). */
function cjk(seed: number, chars: number, punctuated: boolean): string {
  let state = seed * 2654435761 + 1;
  const next = () => ((state = (Math.imul(state, 1103515245) + 12345) >>> 0) / 2 ** 32);
  let text = '';
  while (text.length < chars) {
    text += CJK[Math.floor(next() * CJK.length)];
    if (punctuated && next() < 0.06) text += next() < 0.6 ? '，' : '。';
  }
  return text.slice(0, chars);
}

/**
 * The budget (32,768 UTF-8 bytes of new text) spent whole in one request: 32,768 characters of
 * English, 10,922 of CJK (3 bytes each); and 32,768 CJK characters, refused (the library's cost
 * for the whole text is shown for comparison).
 */
function budgetRows(files: ReturnType<typeof readTokenizerFiles>, js: { encode(text: string, options: { add_special_tokens: boolean }): { ids: number[] } }): string {
  const BUDGET = 32_768;
  const runs = QUICK ? 1 : 5;
  const kinds: Array<[string, (seed: number) => string, boolean]> = [
    ['English-like prose, 32,768 characters', (seed) => prose(seed, BUDGET), true],
    ['CJK prose with punctuation, 10,922 characters', (seed) => cjk(seed, Math.floor(BUDGET / 3), true), true],
    ['CJK, no punctuation (one word), 10,922 characters', (seed) => cjk(seed, Math.floor(BUDGET / 3), false), true],
    ['CJK prose with punctuation, 32,768 characters (refused)', (seed) => cjk(seed, BUDGET, true), false],
  ];
  const rows: string[][] = [];
  for (const [name, make, fits] of kinds) {
    const library: number[] = [];
    const router: number[] = [];
    let tokens = 0;
    for (let i = 0; i < runs; i++) {
      const text = make(3000 + i);
      const lib = timeCpu(() => js.encode(text, { add_special_tokens: false }).ids.length);
      library.push(lib.ms);
      tokens = lib.value;
      // A fresh tokenizer each time: nothing of the text is cached.
      const tokenizer = new PromptTokenizer(files, { selfCheckRequests: 0 });
      tokenizer.tokenize('completions', { prompt: 'warm up the checks. '.repeat(20) });
      router.push(
        timeCpu(() => {
          const outcome = tokenizer.tokenize('completions', { prompt: text, add_special_tokens: false });
          if (('refused' in outcome) === fits) throw new Error(`${name}: ${'refused' in outcome ? outcome.refused : 'not refused'}`);
        }).ms,
      );
    }
    rows.push([name, `${tokens}`, fixed(median(library), 1), fixed(median(router), 1), fixed(Math.max(...router), 1)]);
  }
  // The most messages a chat request may have, each new: 12 bytes (14 with the template's line
  // breaks) and the 16 each is charged for rendering spend the budget. Rendering is most of it.
  const chat: number[] = [];
  let chatTokens = 0;
  for (let i = 0; i < runs; i++) {
    const tokenizer = new PromptTokenizer(files, { selfCheckRequests: 0 });
    tokenizer.tokenize('chat', { messages: [{ role: 'user', content: 'warm up the checks. '.repeat(20) }] });
    const messages = Array.from({ length: 1_024 }, (_, at) => ({ role: at % 2 === 0 ? 'user' : 'assistant', content: `m${at} r${i}`.padEnd(12, '.') }));
    chat.push(
      timeCpu(() => {
        const outcome = tokenizer.tokenize('chat', { messages });
        if (!('prompts' in outcome)) throw new Error(`1,024 messages: ${outcome.refused}`);
        chatTokens = outcome.prompts[0].length;
      }).ms,
    );
  }
  rows.push(['chat, 1,024 new messages of 12 bytes (the most rendered, the budget spent)', `${chatTokens}`, '–', fixed(median(chat), 1), fixed(Math.max(...chat), 1)]);
  return `\n## The new-text budget spent whole: 32,768 UTF-8 bytes in one request, nothing cached\n\n${markdownTable(['text', 'tokens', 'library encode, median ms CPU', 'PromptTokenizer, median ms CPU', 'PromptTokenizer, max ms'], rows)}\n`;
}

void main();
