/**
 * Paths where vLLM does not route by `X-data-parallel-rank` (vLLM 52a31cc: only chat,
 * completions, `/v1/messages` and `/inference/v1/generate` read it; lib/request/vllm-paths.ts):
 * the router picks the upstream by load, claims no rank, sends no header, tells no policy, and
 * says in its decision header and metrics that vLLM chose the engine. Real sockets: mock vLLM
 * servers that ignore the header there as vLLM does, and an upstream that refuses connections.
 */
import { describe, expect, it } from '@jest/globals';
import { createServer } from 'node:http';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { dpRank, type Endpoint, type Options, type Policy } from '../../lib';
import { balancedByVllm } from '../../lib/request/vllm-paths';
import { closedAfterEach, keptIn, exchange, metricValue, serve, startEchoUpstream, startGateway, waitFor, type TestGateway } from '../helpers';

const started = closedAfterEach();

const mock = (options: MockVllmOptions = {}): Promise<MockVllm> => keptIn(started, startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 20, ...options }));
const gateway = (options: Options): Promise<TestGateway> => keptIn(started, startGateway(options));

/** A policy that records every pick it is asked for (least load, first on ties). */
function recordingPolicy(): Policy & { picks: string[] } {
  const picks: string[] = [];
  return {
    name: 'recording',
    picks,
    pick(candidates: readonly Endpoint[]) {
      const chosen = candidates.reduce((best, candidate) => (candidate.load < best.load ? candidate : best));
      picks.push(chosen.key);
      return chosen;
    },
  };
}

const EMBEDDING = JSON.stringify({ model: 'mock-model', input: 'hello' });
const rankHeadersOn = (server: MockVllm, path: string) => server.stats().requests.filter((record) => record.path === path).map((record) => record.rankHeaders);

describe('balancedByVllm', () => {
  it.each([
    ['/v1/embeddings', true],
    ['/v1/embeddings?user=x', true],
    ['/v1/responses', true],
    ['/v1/responses/resp_1/cancel', true],
    ['/pooling', true],
    ['/score', true],
    ['/v1/rerank', true],
    ['/classify', true],
    ['/v1/chat/completions', false],
    ['/v1/completions', false],
    ['/v1/messages', false],
    ['/inference/v1/generate', false],
    ['/v1/embeddingsx', false],
    ['/tokenize', false],
  ])('%s: %s', (url, balanced) => {
    expect(balancedByVllm(url)).toBe(balanced);
  });

  // uvicorn percent-decodes the path before Starlette routes on it (urllib.parse.unquote, in its
  // h11_impl.py and httptools_impl.py); unquote leaves an escape that is not `%` and two hex digits as written.
  it.each([
    ['/v1%2Fembeddings', true],
    ['/v1%2fembeddings', true],
    ['/v1/embedding%73', true],
    ['/%761/rerank', true],
    ['/v1/embedding%73?x=%2F', true],
    ['/v1/responses%2Fresp_1', true],
    ['/v1/chat%2Fcompletions', false],
    ['/v1/embedding%7', false],
    ['/v1/embedding%zz', false],
    ['/v1/embeddings%', false],
    ['/v1/embeddings%00', false],
    ['/v1/embeddings%C3%A9', false],
    ['/v1/embeddings%C3', false],
  ])('48.8: judges the path vLLM routes, percent-decoded: %s: %s', (url, balanced) => {
    expect(balancedByVllm(url)).toBe(balanced);
  });

  // vLLM 52a31cc's /invocations hands a body to chat or completions (which read the header) on a
  // generative model, to a pooling handler on a pooling one (sagemaker/api_router.py:55-87).
  it.each([
    [{ model: 'm', messages: [{ role: 'user', content: 'x' }] }, false],
    [{ model: 'm', prompt: 'x' }, false],
    [{ model: 'm', prompt_embeds: 'AAAA' }, false],
    [{ model: 'm', input: 'x' }, true],
    [{ model: 'm', query: 'q', documents: ['d'] }, true],
    [undefined, true],
  ])('48.20: /invocations with the body %j: balanced by vLLM %s', (members, balanced) => {
    expect(balancedByVllm('/invocations', members)).toBe(balanced);
    expect(balancedByVllm('/%69nvocations?x=1', members)).toBe(balanced);
  });
});

describe('a path vLLM balances itself', () => {
  it('claims no rank: no header upstream, rank "vllm" in the decision and the metrics, and the policy is never asked', async () => {
    const a = await mock();
    const policy = recordingPolicy();
    const front = await gateway({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 2 }], policy, exposeDecision: true, hints: { trust: true } });
    // A trusted hint plays no part either: vLLM would ignore it there.
    const answer = await exchange(front.url, { path: '/v1/embeddings', body: EMBEDDING, headers: { 'x-data-parallel-rank': '1' } });
    expect(answer.status).toBe(200);
    expect(answer.headers['x-dp-router-decision']).toBe('upstream=a; rank=vllm; source=assigned');
    expect(rankHeadersOn(a, '/v1/embeddings')).toEqual([[]]);
    expect(policy.picks).toEqual([]);
    expect(await metricValue(front.registry, 'dp_router_requests_total', { upstream: 'a', rank: 'vllm' })).toBe(1);
    expect(await metricValue(front.registry, 'dp_router_requests_total', { rank: '0' })).toBe(0);
    expect(await metricValue(front.registry, 'dp_router_requests_total', { rank: '1' })).toBe(0);
    expect(await metricValue(front.registry, 'dp_router_rank_hints_total')).toBe(0);
    // A path vLLM routes by header still gets one, from the policy.
    const chat = await exchange(front.url, { body: '{"model":"mock-model","prompt":"hi","max_tokens":1}', headers: { 'x-data-parallel-rank': '1' } });
    expect(chat.headers['x-dp-router-decision']).toBe('upstream=a; rank=1; source=hint');
    expect(rankHeadersOn(a, '/v1/completions')).toEqual([['1']]);
  });

  it('48.8: judges a percent-encoded path as vLLM decodes it, and sends it on as the client wrote it', async () => {
    const a = await startEchoUpstream();
    started.push(a);
    const front = await gateway({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 2 }], exposeDecision: true });
    for (const path of ['/v1%2Fembeddings', '/v1/embedding%73', '/%761/rerank']) {
      const answer = await exchange(front.url, { path, body: EMBEDDING });
      expect(answer.headers['x-dp-router-decision']).toBe('upstream=a; rank=vllm; source=assigned');
    }
    expect(a.seen.map((seen) => [seen.url, seen.rankHeaders])).toEqual([
      ['/v1%2Fembeddings', []],
      ['/v1/embedding%73', []],
      ['/%761/rerank', []],
    ]);
    expect(await metricValue(front.registry, 'dp_router_requests_total', { rank: '0' })).toBe(0);
    expect(await metricValue(front.registry, 'dp_router_requests_total', { rank: '1' })).toBe(0);
  });

  it('48.20: /invocations claims a rank for a chat body the router reads, and none for a pooling body', async () => {
    const a = await startEchoUpstream();
    started.push(a);
    // prefix-aware reads the prompt: the body is decoded.
    const front = await gateway({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 2 }], policy: 'prefix-aware', exposeDecision: true });
    const pooled = await exchange(front.url, { path: '/invocations', body: EMBEDDING });
    expect(pooled.headers['x-dp-router-decision']).toBe('upstream=a; rank=vllm; source=assigned');
    const chat = await exchange(front.url, { path: '/invocations', body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'x' }] }) });
    expect(chat.headers['x-dp-router-decision']).toMatch(/^upstream=a; rank=[01]; source=assigned/);
    expect(a.seen.map((seen) => seen.rankHeaders.length)).toEqual([0, 1]);
  });

  it('counts it in flight on the upstream, not on a rank, until it ends', async () => {
    const a = await startEchoUpstream();
    started.push(a);
    let release = () => undefined as void;
    a.respond = (_req, res) => (release = () => res.end('{}'));
    const front = await gateway({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 2 }] });
    const inflight = (rank: string) => metricValue(front.registry, 'dp_router_inflight_requests', { upstream: 'a', rank });
    const held = exchange(front.url, { path: '/v1/responses', body: JSON.stringify({ model: 'mock-model', input: 'x' }) });
    await waitFor(() => a.seen.length === 1);
    expect(await inflight('vllm')).toBe(1);
    expect(front.router.endpoints().map((endpoint) => endpoint.inflight)).toEqual([0, 0]);
    expect(a.seen[0].rankHeaders).toEqual([]);
    release();
    expect((await held).status).toBe(200);
    await waitFor(async () => (await inflight('vllm')) === 0);
  });

  it('picks the upstream with the least load per engine, and never tells the policy', async () => {
    const a = await mock();
    const b = await mock({ startRank: 2 });
    const policy = recordingPolicy();
    const front = await gateway({
      upstreams: [
        { url: a.url, name: 'a', dataParallelSize: 2 },
        { url: b.url, name: 'b', dataParallelSize: 2, startRank: 2 },
      ],
      policy,
      exposeDecision: true,
    });
    // Two long streams on a (the policy, least load first, puts both there: a is first).
    const abort = new AbortController();
    const streams = await Promise.all(
      [0, 1].map(() => fetch(`${front.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, signal: abort.signal, body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'x' }], max_tokens: 200, stream: true }) })),
    );
    expect(policy.picks).toEqual(['a#0', 'a#1']);
    const answer = await exchange(front.url, { path: '/v1/embeddings', body: EMBEDDING });
    expect(answer.headers['x-dp-router-decision']).toBe('upstream=b; rank=vllm; source=assigned');
    expect(rankHeadersOn(b, '/v1/embeddings')).toEqual([[]]);
    expect(policy.picks).toHaveLength(2);
    abort.abort();
    await Promise.allSettled(streams.map((stream) => stream.text()));
  });

  it('retries a refused connection on another upstream, still without a rank', async () => {
    const b = await mock();
    const refused = createServer();
    await new Promise<void>((resolve) => refused.listen(0, '127.0.0.1', resolve));
    const refusedUrl = `http://127.0.0.1:${(refused.address() as { port: number }).port}`;
    await new Promise<void>((resolve) => refused.close(() => resolve()));
    const front = await gateway({
      upstreams: [
        { url: refusedUrl, name: 'gone', dataParallelSize: 2 },
        { url: b.url, name: 'b', dataParallelSize: 2 },
      ],
      exposeDecision: true,
    });
    const answer = await exchange(front.url, { path: '/classify', body: EMBEDDING });
    expect(answer.status).toBe(200);
    expect(answer.headers['x-dp-router-decision']).toBe('upstream=b; rank=vllm; source=assigned');
    expect(await metricValue(front.registry, 'dp_router_retries_total', { upstream: 'gone', rank: 'vllm' })).toBe(1);
    expect(rankHeadersOn(b, '/classify')).toEqual([[]]);
  });

  it('leaves req.dpRank without a rank and the header removed under dpRank()', async () => {
    const a = await mock();
    const seen: unknown[] = [];
    const rank = dpRank({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 2 }], metrics: false });
    const app = await serve((req, res) => {
      rank(req, res, () => {
        seen.push({ decision: { ...req.dpRank }, header: req.headers['x-data-parallel-rank'] });
        res.end('{}');
      });
    });
    started.push(app, { close: () => rank.close() });
    await exchange(app.url, { path: '/v1/embeddings', body: EMBEDDING, headers: { 'x-data-parallel-rank': '1' } });
    expect(seen).toEqual([{ decision: { upstream: 'a', url: a.url, rank: undefined, source: 'assigned', headerValue: undefined }, header: undefined }]);
  });
});
