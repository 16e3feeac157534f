import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import { createExactRouting, type ExactRouting, type ExactRoutingOptions } from '../../lib/exact-prefix/exact-routing';
import { PromptTokenizer, readTokenizerFiles } from '../../lib/exact-prefix/tokenizer/tokenizer';
import { prefixAware, type PrefixPickContext } from '../../lib/policies/prefix-aware';
import type { Endpoint } from '../../lib/types';
import { Verdicts } from '../../lib/verdicts/verdicts';
import { closedAfterEach, metricValue, startRelay, waitFor } from '../helpers';
import { fakeEndpoints } from '../policies/fake-endpoints';
import { untilJoined } from './helpers';

const started = closedAfterEach();
const RANKS = 4;
const SYSTEMS = [
  'You are a helpful assistant. Answer the user\'s questions briefly and accurately. '.repeat(6),
  'The router sends each request to the data-parallel rank whose prefix cache already holds the longest part of its prompt. '.repeat(5),
  'A system prompt shared by many requests is the common case: the same instructions, the same documents, the same tools. '.repeat(5),
];

async function startMock(): Promise<MockVllm> {
  const mock = await startMockVllm({ dataParallelSize: RANKS, kvEvents: {}, model: 'mock-model' });
  started.push(mock);
  return mock;
}

function route(mock: MockVllm, options: Partial<ExactRoutingOptions> = {}): ExactRouting {
  const kv = mock.kvEvents!;
  const routing = createExactRouting({
    upstreams: [{ name: 'u', url: mock.url, ranks: kv.ranks, kvEvents: { endpoint: kv.endpoints, replayEndpoint: kv.replayEndpoints } }],
    tokenizer: kv.tokenizer,
    ...options,
  });
  started.push(routing);
  return routing;
}

let probes = 0;

/** Requests of one block on every rank until each router's stream of it arrived (a SUB joins asynchronously). */
async function join(mock: MockVllm, ...routers: ExactRouting[]): Promise<void> {
  for (let rank = 0; rank < RANKS; rank++) {
    await untilJoined(
      () => post(mock, '/v1/completions', { prompt: `probe ${probes++} ${'lorem ipsum dolor '.repeat(8)}`, max_tokens: 1 }, rank),
      () => routers.every((router) => router.serves('u', rank)),
    );
  }
}

async function post(mock: MockVllm, path: string, body: object, rank: number): Promise<void> {
  const res = await fetch(mock.url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) },
    body: JSON.stringify(body),
  });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}

const chat = (system: string, question: string) => ({ model: 'mock-model', messages: [{ role: 'system', content: system }, { role: 'user', content: question }], max_tokens: 1 });
const promptOf = (body: ReturnType<typeof chat>) => body.messages.map((message) => message.content).join('\n');

/** Resolves once `router` holds the whole of `body`'s full blocks on `rank`. */
async function heldOn(router: ExactRouting, body: ReturnType<typeof chat>, rank: number, candidates: readonly Endpoint[]): Promise<void> {
  await waitFor(() => {
    const pick = router.lookup('chat', body, candidates);
    return pick !== undefined && pick.matched[rank] === pick.promptBlocks;
  }, 5000, `rank ${rank} to hold the prompt`);
}

describe('createExactRouting', () => {
  it("scores candidates on the engines' events, and a routed prompt's blocks count on its rank before they arrive", async () => {
    const mock = await startMock();
    const router = route(mock);
    await join(mock, router);
    const candidates = fakeEndpoints(RANKS).map((endpoint) => ({ ...endpoint, upstream: 'u' }));
    const body = chat(SYSTEMS[0], 'What is the capital of France?');
    await post(mock, '/v1/chat/completions', body, 2);
    await heldOn(router, body, 2, candidates);
    const pick = router.lookup('chat', body, candidates)!;
    expect(Array.from(pick.matched)).toEqual([0, 0, pick.promptBlocks, 0]);

    const policy = prefixAware();
    const next = chat(SYSTEMS[0], 'And of Spain?');
    const ctx: PrefixPickContext = { path: '/v1/chat/completions', affinityKey: undefined, prompt: promptOf(next), exact: router.lookup('chat', next, candidates) };
    expect(policy.pick(candidates, ctx).rank).toBe(2);
    expect(ctx.exact!.source).toBe('exact');

    // Speculative: a new system prompt routed to rank 3 but not sent counts there at once.
    const fresh = chat(SYSTEMS[1], 'Hello?');
    const first = router.lookup('chat', fresh, candidates)!;
    expect(Math.max(...first.matched)).toBe(0);
    first.chose(3);
    const again = router.lookup('chat', chat(SYSTEMS[1], 'Hello again?'), candidates)!;
    expect(again.matched[3]).toBeGreaterThanOrEqual(4);
    expect(again.matched[0]).toBe(0);
  });

  it("scores a LoRA request under its adapter, known from the model pools before any event named it: never on the base model's blocks", async () => {
    const mock = await startMockVllm({ dataParallelSize: RANKS, kvEvents: {}, model: 'mock-model', loraModules: ['sql-lora'] });
    started.push(mock);
    const pools = route(mock, { isAdapter: (model) => model === 'sql-lora' });
    const events = route(mock);
    await join(mock, pools, events);
    const candidates = fakeEndpoints(RANKS).map((endpoint) => ({ ...endpoint, upstream: 'u' }));
    const base = chat(SYSTEMS[2], 'Which tables?');
    await post(mock, '/v1/chat/completions', base, 2);
    await heldOn(pools, base, 2, candidates);
    await heldOn(events, base, 2, candidates);
    const lora = { ...base, model: 'sql-lora' };
    // vLLM hashes the adapter's blocks with its name: rank 2's base blocks are no hit for it.
    expect(Math.max(...pools.lookup('chat', lora, candidates)!.matched)).toBe(0);
    // Known from events alone, the adapter is scored as the base model until one of its blocks is stored.
    expect(events.lookup('chat', lora, candidates)!.matched[2]).toBeGreaterThan(0);
    await post(mock, '/v1/chat/completions', lora, 1);
    await waitFor(() => pools.lookup('chat', lora, candidates)!.matched[1] > 0 && events.lookup('chat', lora, candidates)!.matched[1] > 0, 5000, "the adapter's blocks on rank 1");
    expect(events.lookup('chat', lora, candidates)!.matched[2]).toBe(0);
  });

  it('speculative entries expire when no event confirms them, and the rank goes stale until its next batch', async () => {
    const mock = await startMock();
    let clock = Date.now();
    const router = route(mock, { now: () => clock, speculativeMs: 1000, confirmAfterMs: 2000 });
    await join(mock, router);
    const candidates = fakeEndpoints(RANKS).map((endpoint) => ({ ...endpoint, upstream: 'u' }));
    const body = chat(SYSTEMS[2], 'Lost?');
    router.lookup('chat', body, candidates)!.chose(1);
    expect(router.lookup('chat', body, candidates)!.matched[1]).toBeGreaterThan(0);
    clock += 1500;
    expect(router.lookup('chat', body, candidates)!.matched[1]).toBe(0);
    expect(router.serves('u', 1)).toBe(true);
    clock += 1000;
    // Routed there 2.5 s ago with blocks to store, and not a batch since.
    expect(router.serves('u', 1)).toBe(false);
    expect(Array.from(router.lookup('chat', body, candidates)!.matched)).toEqual([0, -1, 0, 0]);
    await post(mock, '/v1/chat/completions', body, 1);
    await waitFor(() => router.serves('u', 1), 5000, 'rank 1 fresh again after its batch');
  });

  it('three routers fed the same events agree on every pick, whatever each routed itself', async () => {
    const mock = await startMock();
    const routers = [route(mock), route(mock), route(mock)];
    await join(mock, ...routers);
    const policies = routers.map(() => prefixAware());
    const endpointSets = routers.map(() => fakeEndpoints(RANKS).map((endpoint) => ({ ...endpoint, upstream: 'u' })));
    const pickOn = (at: number, body: ReturnType<typeof chat>) => {
      const ctx: PrefixPickContext = { path: '/v1/chat/completions', affinityKey: undefined, prompt: promptOf(body), exact: routers[at].lookup('chat', body, endpointSets[at]) };
      return policies[at].pick(endpointSets[at], ctx).rank;
    };
    // Each prompt is routed by one router in turn, sent, and its events awaited by all three.
    for (let i = 0; i < 9; i++) {
      const body = chat(SYSTEMS[i % 3], `Question ${i}: what next?`);
      const rank = pickOn(i % 3, body);
      await post(mock, '/v1/chat/completions', body, rank);
      for (const router of routers) await heldOn(router, body, rank, endpointSets[0]);
    }
    for (let i = 0; i < 6; i++) {
      const body = chat(SYSTEMS[i % 3], `Follow-up ${i}?`);
      const picks = routers.map((_, at) => pickOn(at, body));
      expect(new Set(picks).size).toBe(1);
    }
  });

  it("detects a tokenizer that disagrees with the upstream's /tokenize and routes that upstream approximately", async () => {
    const mock = await startMock();
    const files = readTokenizerFiles(mock.kvEvents!.tokenizer);
    const template = String(files.config.chat_template).replace('<|start_header_id|>', '<|start_header_id|> ');
    const other = new PromptTokenizer({ ...files, config: { ...files.config, chat_template: template } });
    const registry = new Registry();
    const warnings: string[] = [];
    const router = route(mock, { tokenizer: other, metrics: { registry, prefix: 'dp_router_' }, warn: (message) => warnings.push(message) });
    await join(mock, router);
    const candidates = fakeEndpoints(RANKS).map((endpoint) => ({ ...endpoint, upstream: 'u' }));
    router.lookup('chat', chat(SYSTEMS[0], 'Agree?'), candidates)!.chose(0);
    await waitFor(() => !router.serves('u', 0), 5000, 'the disagreement to be found');
    expect(router.lookup('chat', chat(SYSTEMS[0], 'Agree?'), candidates)).toBeUndefined();
    expect(warnings).toEqual([expect.stringContaining("disagrees with upstream 'u's /tokenize")]);
    const text = await registry.metrics();
    expect(text).toContain('dp_router_tokenizer_agreement_ratio 0');
    expect(text).toContain('dp_router_kv_stream_fresh{upstream="u",rank="0"} 0');
  });

  it("takes a client's sample that disagrees as a suspicion: the router's own samples agreeing, one source changes nothing; three sources take the verdict", async () => {
    const mock = await startMock();
    // A /tokenize that differs from the router's only on text a client chose (a corner case of the tokenizer).
    const relay = await startRelay(mock.url, (path, _headers, body) => (path === '/tokenize' ? Buffer.from(body.toString().replace('zzqx', 'other words here')) : body));
    started.push(relay);
    const kv = mock.kvEvents!;
    const registry = new Registry();
    const lines: string[] = [];
    const verdicts = new Verdicts({ minSources: 3 }, { registry, prefix: 'dp_router_' }, { info: (_fields, message) => lines.push(message), warn: (message) => lines.push(message) });
    const router = createExactRouting({
      upstreams: [{ name: 'u', url: relay.url, ranks: kv.ranks, kvEvents: { endpoint: kv.endpoints, replayEndpoint: kv.replayEndpoints } }],
      tokenizer: kv.tokenizer,
      agreementSampleRate: 1,
      agreementIntervalMs: 0,
      verdicts,
    });
    started.push(router);
    await join(mock, router);
    const candidates = fakeEndpoints(RANKS).map((endpoint) => ({ ...endpoint, upstream: 'u' }));
    const taken = () => metricValue(registry, 'dp_router_verdicts_total', { upstream: 'u', verdict: 'tokenizer', outcome: 'taken' });
    const refused = () => metricValue(registry, 'dp_router_verdicts_total', { upstream: 'u', verdict: 'tokenizer', outcome: 'refused_single_source' });
    const sample = async (source: string, at: number) => {
      const before = await refused();
      router.lookup('chat', chat(SYSTEMS[0], `Question ${at}: zzqx?`), candidates, () => source)!.chose(0);
      await waitFor(async () => (await refused()) > before || (await taken()) > 0, 5000, 'the sample judged');
    };
    for (let at = 0; at < 4; at++) await sample('key:one', at);
    expect(router.serves('u', 0)).toBe(true);
    expect(await taken()).toBe(0);
    await sample('key:two', 4);
    expect(router.serves('u', 0)).toBe(true);
    await sample('key:three', 5);
    expect(await taken()).toBe(1);
    expect(router.serves('u', 0)).toBe(false);
    expect(lines).toEqual([expect.stringMatching(/verdict 'tokenizer' from 1 source was not taken/), "express-dp-router: upstream 'u': verdict 'tokenizer' taken on evidence from 3 distinct sources."]);
  });

  it('exports its metrics per configured endpoint from the start, then the counts', async () => {
    const mock = await startMock();
    const registry = new Registry();
    const router = route(mock, { metrics: { registry, prefix: 'dp_router_' } });
    const before = await registry.metrics();
    for (const rank of ['0', '3']) {
      expect(before).toContain(`dp_router_kv_events_total{upstream="u",rank="${rank}",type="stored"} 0`);
      expect(before).toContain(`dp_router_kv_event_gaps_total{upstream="u",rank="${rank}",outcome="lost"} 0`);
      expect(before).toContain(`dp_router_kv_index_blocks{upstream="u",rank="${rank}"} 0`);
      expect(before).toContain(`dp_router_kv_stream_fresh{upstream="u",rank="${rank}"} 0`);
      expect(before).toContain(`dp_router_kv_blocks{upstream="u",rank="${rank}",medium="GPU"} 0`);
      expect(before).toContain(`dp_router_kv_blocks{upstream="u",rank="${rank}",medium="CPU"} 0`);
    }
    expect(before).toContain('dp_router_tokenizer_agreement_ratio 1');
    await join(mock, router);
    // Fresh means connected and synced now, not "a batch arrived": send rank 3 a prompt and wait for its store.
    await post(mock, '/v1/completions', { prompt: `rank three ${'lorem ipsum dolor '.repeat(8)}`, max_tokens: 1 }, 3);
    await waitFor(async () => /dp_router_kv_index_blocks\{upstream="u",rank="3"\} [1-9]/.test(await registry.metrics()));
    const after = await registry.metrics();
    expect(after).toMatch(/dp_router_kv_events_total\{upstream="u",rank="3",type="stored"\} [1-9]/);
    expect(after).toMatch(/dp_router_kv_index_blocks\{upstream="u",rank="3"\} [1-9]/);
    expect(after).toContain('dp_router_kv_stream_fresh{upstream="u",rank="3"} 1');
    expect(after).toMatch(/dp_router_kv_blocks\{upstream="u",rank="3",medium="GPU"\} [1-9]/);
    await router.close();
    expect(await registry.metrics()).not.toContain('dp_router_kv_index_blocks{');
  });
});
