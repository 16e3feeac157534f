import { describe, expect, it } from '@jest/globals';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import { prefixAware } from '../../lib/policies/prefix-aware';
import { extractPrompt } from '../../lib/request/prompt';
import { closedAfterEach, metricValue, startGateway, waitFor, type TestGateway } from '../helpers';
import { fakeEndpoints } from '../policies/fake-endpoints';
import { untilJoined } from './helpers';

/*
 * Tier-aware exact routing through the router, on the mock's CPU tier (cpu-tier.ts: written
 * through as vLLM's OffloadingConnector keeps it, its events as vLLM 52a31cc and newer vLLM
 * publish them). What vLLM does with a prompt whose blocks left every GPU but stayed on one
 * rank's CPU tier: that rank's connector finds them after its GPU hits and loads them
 * (offloading/scheduler.py:498-541 `get_num_new_matched_tokens`), any other rank recomputes
 * them. So the prompt belongs on that rank, whatever order a new prefix would be placed in.
 */

const started = closedAfterEach();
const RANKS = 4;
const BLOCK = 16;
const words = (tag: string, count: number) => Array.from({ length: count }, (_, i) => `${tag}${i % 97}`).join(' ');

async function send(url: string, prompt: string, rank?: number): Promise<{ rank: number; decision: string | null; promptTokens: number }> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(rank !== undefined && { 'x-data-parallel-rank': String(rank) }) },
    body: JSON.stringify({ model: 'mock-model', prompt, max_tokens: 1 }),
  });
  expect(res.status).toBe(200);
  const answer = (await res.json()) as { choices: Array<{ text: string }>; usage: { prompt_tokens: number } };
  return { rank: Number(/rank (\d+):/.exec(answer.choices[0].text)?.[1]), decision: res.headers.get('x-dp-router-decision'), promptTokens: answer.usage.prompt_tokens };
}

/** Where a prompt whose lead no rank holds goes: the lead's rendezvous order (a prefix-aware policy without events). */
function newPrefixPlacement(prompt: string): number {
  const endpoints = fakeEndpoints(RANKS).map((endpoint) => ({ ...endpoint, key: `mock#${endpoint.rank}`, upstream: 'mock' }));
  return prefixAware().pick(endpoints, { path: '/v1/completions', affinityKey: undefined, prompt: extractPrompt({ prompt }) }).rank;
}

async function gateway(mock: MockVllm, tierWeights?: Record<string, number>): Promise<TestGateway> {
  const kv = mock.kvEvents!;
  const gw = await startGateway({
    upstreams: [{ url: mock.url, name: 'mock', dataParallelSize: RANKS, kvEvents: { endpoint: kv.endpoints, replayEndpoint: kv.replayEndpoints } }],
    policy: 'prefix-aware',
    prefixAware: { tokenizer: kv.tokenizer, ...(tierWeights && { tierWeights }) },
    exposeDecision: true,
  });
  started.push(gw);
  let probes = 0;
  for (let rank = 0; rank < RANKS; rank++) {
    let joined = false;
    await untilJoined(
      async () => {
        await send(mock.url, `probe ${probes++} ${'lorem ipsum dolor '.repeat(8)}`, rank);
        joined = (await metricValue(gw.registry, 'dp_router_kv_stream_fresh', { rank: String(rank) })) === 1;
      },
      () => joined,
    );
  }
  return gw;
}

/**
 * Writes `family`'s prompt to `holder`, then three others that push it off the GPU (40 blocks)
 * but not off the CPU tier (400); resolves once the router's index has every block written
 * through to the tier. Returns the first prompt's full blocks.
 */
async function evictedToCpu(mock: MockVllm, gw: TestGateway, holder: number, family: string): Promise<number> {
  const cpuHeld = () => metricValue(gw.registry, 'dp_router_kv_blocks', { rank: String(holder), medium: 'CPU' });
  const before = await cpuHeld();
  const familyBlocks = Math.floor((await send(mock.url, `${family} question one`, holder)).promptTokens / BLOCK);
  let written = familyBlocks;
  for (let i = 0; i < 3; i++) written += Math.floor((await send(mock.url, words(`other${i}`, 60), holder)).promptTokens / BLOCK);
  // The last prompts' events (and the GPU's removals before them in their batches) are in.
  await waitFor(async () => (await cpuHeld()) >= before + written, 5000, "the CPU tier's events");
  expect(await metricValue(gw.registry, 'dp_router_kv_index_blocks', { rank: String(holder) })).toBeLessThanOrEqual(40);
  return familyBlocks;
}

const FAMILY = words('handbook', 40);

describe('tier-aware exact routing (prefixAware.tierWeights) through the router, on the mock CPU tier', () => {
  it.each([
    ['current', 'vLLM 52a31cc'],
    ['array-batch', 'newer vLLM'],
  ] as const)('sends a prompt every GPU evicted to the rank whose CPU tier holds it, not where a new prefix would go (%s layout: %s)', async (layout, _version) => {
    const mock = await startMockVllm({ dataParallelSize: RANKS, kvEvents: { layout }, model: 'mock-model', cacheBlocksPerRank: 40, cpuBlocksPerRank: 400 });
    started.push(mock);
    const gw = await gateway(mock);
    const placed = newPrefixPlacement(`${FAMILY} question two`);
    const holder = (placed + 1) % RANKS;
    const familyBlocks = await evictedToCpu(mock, gw, holder, FAMILY);

    const loadedBefore = mock.stats().perRank[holder].cpuCachedTokens ?? 0;
    const routed = await send(gw.url, `${FAMILY} question two`);
    expect({ rank: routed.rank, decision: routed.decision }).toEqual({ rank: holder, decision: `upstream=mock; rank=${holder}; source=assigned; index=exact` });
    // The engine loaded the family's blocks from its tier rather than recomputing them (all but the last, which holds the question).
    expect((mock.stats().perRank[holder].cpuCachedTokens ?? 0) - loadedBefore).toBeGreaterThanOrEqual((familyBlocks - 1) * BLOCK);
    expect(placed).not.toBe(holder);
  });

  it('routes on the GPU alone with the CPU weight at 0 (today): the same prompt goes where a new prefix would', async () => {
    const mock = await startMockVllm({ dataParallelSize: RANKS, kvEvents: {}, model: 'mock-model', cacheBlocksPerRank: 40, cpuBlocksPerRank: 400 });
    started.push(mock);
    const gw = await gateway(mock, { CPU: 0 });
    const placed = newPrefixPlacement(`${FAMILY} question two`);
    const holder = (placed + 1) % RANKS;
    await evictedToCpu(mock, gw, holder, FAMILY);
    expect((await send(gw.url, `${FAMILY} question two`)).rank).toBe(placed);
  });
});
