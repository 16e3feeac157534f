import { describe, expect, it } from '@jest/globals';
import { request as httpRequest } from 'node:http';
import { redisTokenStore, type Options, type TokenStore } from '../../lib';
import { createMemoryTokenStore } from '../../lib/admission/memory-store';
import { startMockVllm } from '../../example-server/mock-vllm';
import { closedAfterEach, exchange, metricValue, serve, sleep, startGateway, waitFor, type Exchange, type TestGateway } from '../helpers';
import { redisClient, startHeldUpstream, startRedis } from './helpers';

const started = closedAfterEach();

async function gateway(options: Options): Promise<TestGateway> {
  const gw = await startGateway({ logger: false, ...options });
  started.push(gw);
  return gw;
}

const client = (url: string) => redisClient(url, started);

const tenant = { header: 'x-tenant-id', trust: true };
// "hello world!" is 3 tokens to the mock and it generates max_tokens: 103 tokens a request.
const body = JSON.stringify({ model: 'mock-model', prompt: 'hello world!', max_tokens: 100 });
const PER_REQUEST = 103;

/** A tenant's count in the current window and the one before (a run may cross a minute's end); `tag`: `<prefix><tenant>`. */
async function bothWindows(redis: ReturnType<typeof client>, tag: string): Promise<number> {
  const window = Math.floor(Date.now() / 60_000);
  const [current, previous] = (await redis.call('MGET', `{${tag}}:${window}`, `{${tag}}:${window - 1}`)) as (string | null)[];
  return Number(current ?? 0) + Number(previous ?? 0);
}

/** Sends `count` requests at once for tenant `a`, spread over `gateways`. */
function burst(gateways: TestGateway[], count: number): Promise<Exchange[]> {
  return Promise.all(Array.from({ length: count }, (_, i) => exchange(gateways[i % gateways.length].url, { body, headers: { 'x-tenant-id': 'a' } })));
}

/** Admitted requests' use is within the budget plus one request: the last admitted just under it. */
function expectWithinBudget(answers: Exchange[], perMinute: number): void {
  const admitted = answers.filter((answer) => answer.status === 200).length;
  expect(admitted).toBeGreaterThan(0);
  expect(admitted * PER_REQUEST).toBeLessThanOrEqual(perMinute + PER_REQUEST);
  for (const refused of answers.filter((answer) => answer.status !== 200)) {
    expect(refused.status).toBe(429);
    expect(JSON.parse(refused.body).error.type).toBe('RateLimitError');
    expect(refused.headers['retry-after']).toMatch(/^[1-9][0-9]*$/);
  }
}

describe('token budgets under concurrency', () => {
  it('admits concurrent requests only while their reserved estimates fit the budget (memory store)', async () => {
    const mock = await startMockVllm({ dataParallelSize: 1, decodeMsPerToken: 2 });
    started.push(mock);
    const gw = await gateway({ upstreams: [{ url: mock.url }], admission: { tenant, tokens: { perMinute: 1_000 } } });
    expectWithinBudget(await burst([gw], 30), 1_000);
  });

  it('reserves atomically in Redis: two gateways sharing a budget admit no more than one would', async () => {
    const redis = await startRedis();
    started.push({ close: () => redis.stop() });
    const mock = await startMockVllm({ dataParallelSize: 1, decodeMsPerToken: 2 });
    started.push(mock);
    const admission = () => ({ tenant, tokens: { perMinute: 1_000, store: redisTokenStore(client(redis.url), { prefix: 'c:' }) } });
    const one = await gateway({ upstreams: [{ url: mock.url }], admission: admission() });
    const two = await gateway({ upstreams: [{ url: mock.url }], admission: admission() });
    const answers = await burst([one, two], 30);
    expectWithinBudget(answers, 1_000);
    // Settled to vLLM's usage once every answer ended: the reservations are gone.
    const admitted = answers.filter((answer) => answer.status === 200).length;
    await waitFor(async () => (await bothWindows(client(redis.url), 'c:a')) === admitted * PER_REQUEST);
  });
});

describe('what a request is charged', () => {
  it('charges a chunked prompt by the bytes read, not its missing Content-Length', async () => {
    const mock = await startMockVllm({ dataParallelSize: 1 });
    started.push(mock);
    const gw = await gateway({ upstreams: [{ url: mock.url }], admission: { tenant, tokens: { perMinute: 20_000 } } });
    // A 120 KB prompt sent chunked, streamed back without usage: estimated at about 30 000 tokens.
    const prompt = 'lorem ipsum '.repeat(10_000);
    const streamed = JSON.stringify({ model: 'mock-model', prompt, max_tokens: 2, stream: true });
    const status = await new Promise<number>((resolve, reject) => {
      const outgoing = httpRequest(`${gw.url}/v1/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'transfer-encoding': 'chunked', 'x-tenant-id': 'a' } });
      outgoing.on('response', (answer) => {
        answer.resume();
        answer.on('end', () => resolve(answer.statusCode ?? 0));
      });
      outgoing.on('error', reject);
      outgoing.write(streamed.slice(0, 60_000));
      setTimeout(() => outgoing.end(streamed.slice(60_000)), 20);
    });
    expect(status).toBe(200);
    const next = await exchange(gw.url, { body: JSON.stringify({ model: 'mock-model', prompt: 'hi', max_tokens: 1 }), headers: { 'x-tenant-id': 'a' } });
    expect(next.status).toBe(429);
  });

  it('finds the last usage wherever it is: vLLM writes prompt_logprobs after it', async () => {
    // vLLM's ChatCompletionResponse has `usage`, then `prompt_logprobs` (chat_completion/protocol.py:116-119 at 52a31cc).
    const logprobs = Array.from({ length: 200 }, (_, i) => ({ [String(1000 + i)]: { logprob: -1.25, rank: 1, decoded_token: i === 7 ? 'usage' : 'tok' } }));
    const answer = JSON.stringify({
      id: 'chatcmpl-1',
      object: 'chat.completion',
      created: 1,
      model: 'm',
      choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
      usage: { prompt_tokens: 4990, total_tokens: 5000, completion_tokens: 10, prompt_tokens_details: null },
      prompt_logprobs: [null, ...logprobs],
    });
    expect(answer.length - answer.indexOf('"usage"')).toBeGreaterThan(8 * 1024);
    const upstream = await serve((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(answer);
      });
    });
    started.push(upstream);
    const gw = await gateway({ upstreams: [{ url: upstream.url }], admission: { tenant, tokens: { perMinute: 5_000 } } });
    const ask = () => exchange(gw.url, { path: '/v1/chat/completions', body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], prompt_logprobs: 1 }), headers: { 'x-tenant-id': 'a' } });
    expect((await ask()).status).toBe(200);
    expect((await ask()).status).toBe(429);
  });

  it('refunds the reservation of a request that waited past the queue timeout, and settles the others to their usage', async () => {
    const redis = await startRedis();
    started.push({ close: () => redis.stop() });
    const upstream = await startHeldUpstream();
    started.push(upstream);
    const gw = await gateway({ upstreams: [{ url: upstream.url }], admission: { tenant, maxInflightPerRank: 1, queue: { timeoutMs: 150 }, tokens: { perMinute: 1_000, store: redisTokenStore(client(redis.url), { prefix: 'r:' }) } } });
    const count = () => bothWindows(client(redis.url), 'r:a');
    const ask = JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 400 });
    const reserved = Math.ceil(Buffer.byteLength(ask) / 4) + 400;
    const running = exchange(gw.url, { body: ask, headers: { 'x-tenant-id': 'a' } });
    await waitFor(() => upstream.held === 1);
    expect(await count()).toBe(reserved);
    // Reserved too, then waits, then times out: 503, and its reservation is given back.
    const late = await exchange(gw.url, { body: ask, headers: { 'x-tenant-id': 'a' } });
    expect(late.status).toBe(503);
    await waitFor(async () => (await count()) === reserved);
    // The held upstream's answer reports 5 tokens: the running request settles to that.
    upstream.releaseAll();
    expect((await running).status).toBe(200);
    await waitFor(async () => (await count()) === 5);
    expect(await metricValue(gw.registry, 'dp_router_token_store_errors_total')).toBe(0);
  });

  it.each([
    ['n = 8 choices', { model: 'm', prompt: 'hi', max_tokens: 100, n: 8 }],
    ['a decoy max_tokens: 1 in vllm_xargs before the top-level limit', { model: 'm', vllm_xargs: { max_tokens: 1 }, prompt: 'hi', max_tokens: 800 }],
  ])('48.9: a request reserves what vLLM may generate for it (%s): the next is refused while it runs', async (_label, ask) => {
    const upstream = await startHeldUpstream();
    started.push(upstream);
    const gw = await gateway({ upstreams: [{ url: upstream.url }], admission: { tenant, tokens: { perMinute: 700 } } });
    const running = exchange(gw.url, { body: JSON.stringify(ask), headers: { 'x-tenant-id': 'a' } });
    await waitFor(() => upstream.held === 1);
    // 800 tokens at most (capped at the budget) are reserved: nothing is left for a second request.
    const next = await exchange(gw.url, { body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 10 }), headers: { 'x-tenant-id': 'a' } });
    expect(next.status).toBe(429);
    expect(upstream.arrived).toHaveLength(1);
    upstream.releaseAll();
    expect((await running).status).toBe(200);
  });

  it('refunds the reservation of a request the upstream refuses (a 4xx counts no tokens)', async () => {
    const upstream = await serve((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end('{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}');
      });
    });
    started.push(upstream);
    const gw = await gateway({ upstreams: [{ url: upstream.url }], admission: { tenant, tokens: { perMinute: 1_000 } } });
    const ask = JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 900 });
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await exchange(gw.url, { body: ask, headers: { 'x-tenant-id': 'a' } })).status);
    expect(statuses).toEqual([400, 400, 400]);
  });

  it('gives back a reservation the store grants after the client left', async () => {
    const upstream = await startHeldUpstream();
    started.push(upstream);
    // A store of the user's own whose `take` answers when the test says.
    const memory = createMemoryTokenStore();
    let grant!: () => void;
    const granted = new Promise<void>((resolve) => (grant = resolve));
    let asked = false;
    let answered = false;
    const store: TokenStore = {
      kind: 'slow',
      read: memory.read,
      add: memory.add,
      take: async (...args) => {
        asked = true;
        await granted;
        answered = true;
        return memory.take!(...args);
      },
    };
    const gw = await gateway({ upstreams: [{ url: upstream.url }], admission: { tenant, tokens: { perMinute: 1_000, store } } });
    const leaving = httpRequest(`${gw.url}/v1/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'x-tenant-id': 'a' } });
    leaving.on('error', () => undefined);
    leaving.end(JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 500 }));
    await waitFor(() => asked);
    leaving.destroy();
    await new Promise((resolve) => setTimeout(resolve, 50));
    grant();
    await waitFor(() => answered);
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(memory.read('a', Math.floor(Date.now() / 60_000))).toEqual({ current: 0, previous: 0 });
    expect(upstream.arrived).toEqual([]);
  });
});

describe('Retry-After of a tenant over its budget', () => {
  it('48.10: a tenant kept out only by a reservation in flight is told to retry when reservations settle (their typical hold), not when the minute ends', async () => {
    // The whole test within one fixed minute: the window's own answer is then at least 8 s.
    const into = Date.now() % 60_000;
    if (into > 50_000) await sleep(60_000 - into + 100);
    const upstream = await startHeldUpstream();
    started.push(upstream);
    const gw = await gateway({ upstreams: [{ url: upstream.url }], admission: { tenant, tokens: { perMinute: 1_000 } } });
    const ask = (maxTokens: number) => exchange(gw.url, { body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: maxTokens }), headers: { 'x-tenant-id': 'a' } });
    // A first request holds its reservation for about 1.5 s: the typical hold.
    const first = ask(10);
    await waitFor(() => upstream.held === 1);
    await sleep(1_500);
    upstream.releaseOne();
    expect((await first).status).toBe(200);
    // One whose reservation is the whole budget; the next is refused while it runs.
    const running = ask(5_000);
    await waitFor(() => upstream.held === 1);
    const refused = await ask(10);
    expect(refused.status).toBe(429);
    const retryAfter = Number(refused.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(2);
    // It settles to its usage (5 tokens) when it ends: the budget lets the tenant in again.
    upstream.releaseAll();
    expect((await running).status).toBe(200);
    const next = ask(10);
    await waitFor(() => upstream.held === 1);
    upstream.releaseAll();
    expect((await next).status).toBe(200);
  });
});
