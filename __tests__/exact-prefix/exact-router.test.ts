import { describe, expect, it } from '@jest/globals';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join as joinPath } from 'node:path';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import { dpRouter, type Options } from '../../lib';
import { prefixAware } from '../../lib/policies/prefix-aware';
import { extractPrompt } from '../../lib/request/prompt';
import { closedAfterEach, metricValue, startGateway, waitFor, type TestGateway } from '../helpers';
import { fakeEndpoints } from '../policies/fake-endpoints';
import { untilJoined } from './helpers';

const started = closedAfterEach();
const RANKS = 4;
const SYSTEM = 'You are a helpful assistant. Answer the user\'s questions briefly and accurately. '.repeat(6);
const OTHER_SYSTEMS = [
  'The router sends each request to the data-parallel rank whose prefix cache already holds the longest part of its prompt. '.repeat(5),
  'A system prompt shared by many requests is the common case: the same instructions, the same documents, the same tools. '.repeat(5),
  SYSTEM,
];

async function startMock(): Promise<MockVllm> {
  const mock = await startMockVllm({ dataParallelSize: RANKS, kvEvents: {}, model: 'mock-model' });
  started.push(mock);
  return mock;
}

function options(mock: MockVllm, tokenizer: string = mock.kvEvents!.tokenizer): Options {
  const kv = mock.kvEvents!;
  return {
    upstreams: [{ url: mock.url, name: 'mock', dataParallelSize: RANKS, kvEvents: { endpoint: kv.endpoints, replayEndpoint: kv.replayEndpoints } }],
    policy: 'prefix-aware',
    prefixAware: { tokenizer },
    exposeDecision: true,
  };
}

async function gateway(mock: MockVllm, tokenizer?: string): Promise<TestGateway> {
  const started_ = await startGateway(options(mock, tokenizer));
  started.push(started_);
  return started_;
}

const fresh = (gw: TestGateway, rank: number) => metricValue(gw.registry, 'dp_router_kv_stream_fresh', { upstream: 'mock', rank: String(rank) });

let probes = 0;

/** One-block requests straight to each rank until every gateway's stream of it arrived (a SUB joins asynchronously). */
async function join(mock: MockVllm, ...gateways: TestGateway[]): Promise<void> {
  for (let rank = 0; rank < RANKS; rank++) {
    let joined = false;
    await untilJoined(
      async () => {
        await send(mock.url, { model: 'mock-model', prompt: `probe ${probes++} ${'lorem ipsum dolor '.repeat(8)}`, max_tokens: 1 }, '/v1/completions', rank);
        joined = (await Promise.all(gateways.map((gw) => fresh(gw, rank)))).every((value) => value === 1);
      },
      () => joined,
    );
  }
}

const chat = (system: string, question: string) => ({ model: 'mock-model', messages: [{ role: 'system', content: system }, { role: 'user', content: question }], max_tokens: 1 });

/** Sends a request; returns the rank that answered and the decision header. */
async function send(url: string, body: object, path = '/v1/chat/completions', rank?: number): Promise<{ rank: number; decision: string | null }> {
  const res = await fetch(url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(rank !== undefined && { 'x-data-parallel-rank': String(rank) }) },
    body: JSON.stringify(body),
  });
  const answer = (await res.json()) as { choices: Array<{ message?: { content: string }; text?: string }> };
  expect(res.status).toBe(200);
  const text = answer.choices[0].message?.content ?? answer.choices[0].text ?? '';
  return { rank: Number(/rank (\d+):/.exec(text)?.[1]), decision: res.headers.get('x-dp-router-decision') };
}

/** Where a prefix-aware router without events would put this chat first: its lead's rendezvous order. */
function approximatePlacement(body: ReturnType<typeof chat>): number {
  const endpoints = fakeEndpoints(RANKS).map((endpoint) => ({ ...endpoint, key: `mock#${endpoint.rank}`, upstream: 'mock' }));
  return prefixAware().pick(endpoints, { path: '/v1/chat/completions', affinityKey: undefined, prompt: extractPrompt(body) }).rank;
}

describe('exact prefix routing through the router (real ZMQ, the mock vLLM)', () => {
  it('routes a prompt to the rank the engines report holding its prefix, where the approximate index would not', async () => {
    const mock = await startMock();
    const gw = await gateway(mock);
    await join(mock, gw);
    const first = chat(SYSTEM, 'What is the capital of France?');
    const placed = approximatePlacement(first);
    // Sent straight to another rank: only the engines' events can tell the router where it is.
    const holder = (placed + 1) % RANKS;
    const blocksBefore = await metricValue(gw.registry, 'dp_router_kv_index_blocks', { rank: String(holder) });
    expect((await send(mock.url, first, '/v1/chat/completions', holder)).rank).toBe(holder);
    await waitFor(async () => (await metricValue(gw.registry, 'dp_router_kv_index_blocks', { rank: String(holder) })) > blocksBefore, 5000, 'the events of the first chat');

    const second = await send(gw.url, chat(SYSTEM, 'And the capital of Spain?'));
    expect(second).toEqual({ rank: holder, decision: `upstream=mock; rank=${holder}; source=assigned; index=exact` });
    expect(approximatePlacement(chat(SYSTEM, 'And the capital of Spain?'))).not.toBe(holder);
  });

  it("routes a LoRA request to the rank holding its adapter's blocks (vLLM keys them [lora_name], #33304)", async () => {
    const mock = await startMockVllm({ dataParallelSize: RANKS, kvEvents: {}, model: 'mock-model', loraModules: ['sql-lora'] });
    started.push(mock);
    const gw = await gateway(mock);
    await join(mock, gw);
    const lora = (question: string) => ({ ...chat(SYSTEM, question), model: 'sql-lora' });
    const holder = (approximatePlacement(chat(SYSTEM, 'Which tables?')) + 1) % RANKS;
    const blocksBefore = await metricValue(gw.registry, 'dp_router_kv_index_blocks', { rank: String(holder) });
    expect((await send(mock.url, lora('Which tables?'), '/v1/chat/completions', holder)).rank).toBe(holder);
    await waitFor(async () => (await metricValue(gw.registry, 'dp_router_kv_index_blocks', { rank: String(holder) })) > blocksBefore, 5000, "the adapter's blocks indexed");
    expect(await send(gw.url, lora('Which columns?'))).toEqual({ rank: holder, decision: `upstream=mock; rank=${holder}; source=assigned; index=exact` });
    expect(approximatePlacement(chat(SYSTEM, 'Which columns?'))).not.toBe(holder);
  });

  it('routes a rank whose stream is stale on the approximate index, and says so', async () => {
    const mock = await startMock();
    const gw = await gateway(mock);
    // No batch has come from any rank yet: every stream is stale.
    for (let rank = 0; rank < RANKS; rank++) expect(await fresh(gw, rank)).toBe(0);
    const { decision } = await send(gw.url, chat(SYSTEM, 'Stale?'));
    expect(decision).toMatch(/; source=assigned; index=approximate$/);
  });

  it('routes a prompt the tokenizer cannot take on the approximate index, and a body past the budget without tokenizing it', async () => {
    const mock = await startMock();
    const gw = await startGateway({ ...options(mock), maxBufferedBytes: 4096 });
    started.push(gw);
    await join(mock, gw);
    const image = { model: 'mock-model', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:,' } }, { type: 'text', text: SYSTEM }] }], max_tokens: 1 };
    const refused = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(image) });
    await refused.arrayBuffer();
    expect(refused.headers.get('x-dp-router-decision')).toMatch(/; index=approximate$/);
    // 4 × 1,100 bytes cannot be leased for decoding: routed on the prompt text alone.
    const body = chat('x'.repeat(900), 'Budget?');
    expect((await send(gw.url, body)).decision).toMatch(/; index=approximate$/);
    expect((await send(gw.url, chat(SYSTEM, 'Within budget?'))).decision).toMatch(/; index=/);
  });

  it('three routers fed the same events agree on every pick', async () => {
    const mock = await startMock();
    const gateways = [await gateway(mock), await gateway(mock), await gateway(mock)];
    await join(mock, ...gateways);
    for (let i = 0; i < 6; i++) await send(gateways[i % 3].url, chat(OTHER_SYSTEMS[i % 3], `Question ${i}?`));
    for (let i = 0; i < 6; i++) {
      const body = chat(OTHER_SYSTEMS[i % 3], `Follow-up ${i}?`);
      const answers = [];
      for (const gw of gateways) answers.push(await send(gw.url, body));
      expect(answers.map((answer) => answer.rank)).toEqual([answers[0].rank, answers[0].rank, answers[0].rank]);
      expect(answers.every((answer) => answer.decision!.endsWith('; index=exact'))).toBe(true);
    }
  });

  it("falls back to the approximate index when the tokenizer disagrees with the upstream's /tokenize", async () => {
    const mock = await startMock();
    const dir = mkdtempSync(joinPath(tmpdir(), 'dp-router-tokenizer-'));
    started.push({ close: () => rmSync(dir, { recursive: true, force: true }) });
    copyFileSync(joinPath(mock.kvEvents!.tokenizer, 'tokenizer.json'), joinPath(dir, 'tokenizer.json'));
    const config = JSON.parse(readFileSync(joinPath(mock.kvEvents!.tokenizer, 'tokenizer_config.json'), 'utf8')) as { chat_template: string };
    config.chat_template = config.chat_template.replace('<|start_header_id|>', '<|start_header_id|> ');
    writeFileSync(joinPath(dir, 'tokenizer_config.json'), JSON.stringify(config));
    const warnings: string[] = [];
    const gw = await startGateway({ ...options(mock, dir), logger: { warn: (message) => warnings.push(message) } });
    started.push(gw);
    await join(mock, gw);
    expect(await metricValue(gw.registry, 'dp_router_tokenizer_agreement_ratio')).toBe(1);
    // The first request is always checked.
    expect((await send(gw.url, chat(SYSTEM, 'Agree?'))).decision).toMatch(/; index=exact$/);
    await waitFor(async () => (await metricValue(gw.registry, 'dp_router_tokenizer_agreement_ratio')) === 0, 5000, 'the disagreement');
    expect((await send(gw.url, chat(SYSTEM, 'Agree now?'))).decision).toMatch(/; index=approximate$/);
    expect(await fresh(gw, 0)).toBe(0);
    expect(warnings).toEqual([expect.stringMatching(/^express-dp-router: the tokenizer disagrees with upstream 'mock's \/tokenize \(first difference at token \d+/)]);
  });

  it.each([
    [{ kvEvents: { endpoint: 'tcp://*:5557' } }, /`upstreams\[0\]\.kvEvents\.endpoint` .*connect to its address/],
    [{ kvEvents: { endpoint: ['tcp://h:1', 'tcp://h:2'] } }, /`upstreams\[0\]\.kvEvents\.endpoint` lists 2 endpoints for 4 ranks/],
    [{ kvEvents: { endpoints: 'tcp://h:5557' } }, /`upstreams\[0\]\.kvEvents\.endpoints` is not an option\. Did you mean `endpoint`\?/],
    [{ kvEvents: {} }, /`upstreams\[0\]\.kvEvents\.endpoint` is required/],
    [{ kvEvents: { endpoint: 'tcp://h:5557', topic: 7 } }, /`upstreams\[0\]\.kvEvents\.topic` must be a string/],
  ])('rejects a wrong kvEvents at creation: %j', (upstream, message) => {
    expect(() => dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: RANKS, ...upstream } as never], metrics: false })).toThrow(message);
  });

  it('rejects a tokenizer it cannot load at creation', () => {
    expect(() => dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000' }], policy: 'prefix-aware', prefixAware: { tokenizer: '/nonexistent/model' }, metrics: false })).toThrow(
      /`prefixAware\.tokenizer` could not be loaded: .*nonexistent/,
    );
    expect(() => dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000' }], policy: 'prefix-aware', prefixAware: { tokenizer: 42 as never }, metrics: false })).toThrow(
      /`prefixAware\.tokenizer` must be a path or two paths, got 42/,
    );
  });
});
