import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import type { PolicyName } from '../../lib';
import { startEchoUpstream } from '../helpers/echo-upstream';
import { startGateway, type TestGateway } from '../helpers/app';
import { closedAfterEach } from '../helpers/lifecycle';

const started = closedAfterEach();

/**
 * Each mock rank caches about two groups' system prompts (52 blocks each), as a real KV cache
 * holds a fraction of the fleet's prefixes: spreading a group over ranks then costs hits.
 */
async function gatewayOverMock(policy: PolicyName): Promise<{ gateway: TestGateway; mock: MockVllm }> {
  const mock = await startMockVllm({ dataParallelSize: 4, cacheBlocksPerRank: 120 });
  const gateway = await startGateway({ upstreams: [{ url: mock.url, name: 'mock', dataParallelSize: 4 }], policy });
  started.push(gateway, mock);
  return { gateway, mock };
}

/** 6 groups × 6 chats sharing a long per-group system prompt, interleaved as real traffic is. */
function sharedPrefixChats(): Array<{ group: number; body: object }> {
  const chats = [];
  for (let turn = 0; turn < 6; turn++) {
    for (let group = 0; group < 6; group++) {
      const system = `You are assistant number ${group}. `.repeat(120);
      chats.push({ group, body: { model: 'mock-model', max_tokens: 1, messages: [{ role: 'system', content: system }, { role: 'user', content: `question ${turn} for ${group}` }] } });
    }
  }
  return chats;
}

function hitRate(mock: MockVllm): number {
  const ranks = Object.values(mock.stats().perRank);
  const prompt = ranks.reduce((sum, rank) => sum + rank.promptTokens, 0);
  return ranks.reduce((sum, rank) => sum + rank.cachedTokens, 0) / prompt;
}

describe('prefix-aware through the middleware', () => {
  it('keeps each prefix group on one rank, and the mock vLLM counts the cache hits', async () => {
    const aware = await gatewayOverMock('prefix-aware');
    const roundRobin = await gatewayOverMock('round-robin');
    const ranksByGroup = new Map<number, Set<string>>();
    for (const { group, body } of sharedPrefixChats()) {
      const answer = await request(aware.gateway.url).post('/v1/chat/completions').send(body);
      expect(answer.status).toBe(200);
      const rank = /^rank (\d+):/.exec(answer.body.choices[0].message.content)![1];
      ranksByGroup.set(group, (ranksByGroup.get(group) ?? new Set()).add(rank));
      expect((await request(roundRobin.gateway.url).post('/v1/chat/completions').send(body)).status).toBe(200);
    }
    for (const ranks of ranksByGroup.values()) expect(ranks.size).toBe(1);
    expect(new Set([...ranksByGroup.values()].map((ranks) => [...ranks][0])).size).toBe(4);
    const awareHits = hitRate(aware.mock);
    const roundRobinHits = hitRate(roundRobin.mock);
    // Every group's first request misses; the other five of six hit the whole system prompt.
    expect(awareHits).toBeGreaterThan(0.75);
    expect(awareHits).toBeGreaterThan(2.5 * roundRobinHits);
  });

  it('forwards the original body bytes, never re-encoded', async () => {
    const echo = await startEchoUpstream();
    const gateway = await startGateway({ upstreams: [{ url: echo.url }], policy: 'prefix-aware' });
    started.push(gateway, echo);
    const raw = '{ "prompt" : "caf\\u00e9   x",\n  "max_tokens":1, "z":1e3, "a":[ ] }';
    const answer = await request(gateway.url).post('/v1/completions').set('content-type', 'application/json').send(raw);
    expect(answer.status).toBe(200);
    expect(echo.seen[0].body.toString()).toBe(raw);
  });

  it('answers 400 for malformed JSON and 413 over maxBodyBytes, forwarding nothing', async () => {
    const echo = await startEchoUpstream();
    const gateway = await startGateway({ upstreams: [{ url: echo.url }], policy: 'prefix-aware', maxBodyBytes: 2048 });
    started.push(gateway, echo);
    const malformed = await request(gateway.url).post('/v1/completions').set('content-type', 'application/json').send('{"prompt": "x"');
    expect(malformed.status).toBe(400);
    expect(malformed.body.error).toMatchObject({ type: 'BadRequestError', code: 400 });
    const oversized = await request(gateway.url).post('/v1/completions').send({ prompt: 'x'.repeat(4096) });
    expect(oversized.status).toBe(413);
    expect(oversized.body.error.code).toBe(413);
    expect(echo.seen).toHaveLength(0);
  });
});

describe('session-affinity through the middleware', () => {
  it('sends every request of a session to the same rank, by header or by the body field `user`', async () => {
    const { gateway } = await gatewayOverMock('session-affinity');
    const rankOf = async (session: string, by: 'header' | 'body') => {
      const call = request(gateway.url).post('/v1/completions');
      if (by === 'header') call.set('x-session-id', session);
      const answer = await call.send({ model: 'mock-model', prompt: 'hi', max_tokens: 1, ...(by === 'body' ? { user: session } : {}) });
      return /^rank (\d+):/.exec(answer.body.choices[0].text)![1];
    };
    const homes = new Map<string, string>();
    for (let round = 0; round < 4; round++) {
      for (let session = 0; session < 12; session++) {
        const key = `session-${session}`;
        const rank = await rankOf(key, round % 2 === 0 ? 'header' : 'body');
        if (!homes.has(key)) homes.set(key, rank);
        expect(rank).toBe(homes.get(key));
      }
    }
    expect(new Set(homes.values()).size).toBeGreaterThan(1);
  });
});
