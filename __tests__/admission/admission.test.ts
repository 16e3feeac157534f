import { describe, expect, it } from '@jest/globals';
import express from 'express';
import { createServer, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import { dpRouter, type Options } from '../../lib';
import { startMockVllm } from '../../example-server/mock-vllm';
import { closedAfterEach, exchange, metricValue, rawRefusal, startGateway, waitFor, type TestGateway } from '../helpers';
import { startHeldUpstream, type HeldUpstream } from './helpers';

const started = closedAfterEach();

async function held(): Promise<HeldUpstream> {
  const upstream = await startHeldUpstream();
  started.push(upstream);
  return upstream;
}

async function gateway(options: Options): Promise<TestGateway> {
  const gw = await startGateway({ logger: false, ...options });
  started.push(gw);
  return gw;
}

const depth = (gw: TestGateway, priority = 'normal') => metricValue(gw.registry, 'dp_router_queue_depth', { priority });
const outcome = (gw: TestGateway, name: string) => metricValue(gw.registry, 'dp_router_admission_total', { outcome: name });

/** Sends one request labelled `label` and waits until it is at an upstream or in the queue (`queued` more than before). */
async function sendInOrder(gw: TestGateway, upstream: HeldUpstream | HeldUpstream[], label: string, headers: Record<string, string> = {}, localAddress?: string, body?: string) {
  const upstreams = Array.isArray(upstream) ? upstream : [upstream];
  const arrived = () => upstreams.reduce((sum, one) => sum + one.arrived.length, 0);
  const before = arrived();
  const queuedBefore = await metricValue(gw.registry, 'dp_router_queue_depth');
  const answer = exchange(gw.url, { headers: { 'x-label': label, ...headers }, localAddress, body });
  await waitFor(async () => arrived() > before || (await metricValue(gw.registry, 'dp_router_queue_depth')) > queuedBefore, 3000, () => `${label} neither arrived nor queued: ${upstreams.map((one) => one.arrived)}`);
  // Wrapped: an async function returning the promise itself would wait for the answer.
  return { done: answer };
}

describe('admission control', () => {
  it('never sends an endpoint more than maxInflightPerRank, measured at the mock, and drains to zero', async () => {
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 2, maxNumSeqs: 100 });
    started.push(mock);
    const gw = await gateway({ upstreams: [{ url: mock.url, dataParallelSize: 2 }], admission: { maxInflightPerRank: 2 } });
    const body = JSON.stringify({ model: 'mock-model', prompt: 'hello', max_tokens: 5, stream: true });
    const answers = await Promise.all(Array.from({ length: 24 }, () => exchange(gw.url, { body })));
    expect(answers.map((answer) => answer.status)).toEqual(Array(24).fill(200));
    const { perRank } = mock.stats();
    expect(perRank[0].peakConcurrent).toBeLessThanOrEqual(2);
    expect(perRank[1].peakConcurrent).toBeLessThanOrEqual(2);
    expect(await outcome(gw, 'queued')).toBeGreaterThan(0);
    expect((await outcome(gw, 'queued')) + (await outcome(gw, 'admitted'))).toBe(24);
    await waitFor(() => gw.router.endpoints().every((endpoint) => endpoint.inflight === 0));
    expect(await depth(gw)).toBe(0);
  });

  it('serves waiting tenants round-robin, each FIFO, and strips nothing but the priority header', async () => {
    const upstream = await held();
    const gw = await gateway({ upstreams: [{ url: upstream.url }], admission: { maxInflightPerRank: 1, tenant: { header: 'x-tenant-id', trust: true } } });
    const answers = [await sendInOrder(gw, upstream, 'a0', { 'x-tenant-id': 'a' })];
    for (const [label, tenant] of [['a1', 'a'], ['a2', 'a'], ['a3', 'a'], ['b1', 'b'], ['b2', 'b'], ['c1', 'c']]) {
      answers.push(await sendInOrder(gw, upstream, label, { 'x-tenant-id': tenant }));
    }
    expect(await depth(gw)).toBe(6);
    for (let i = 0; i < 7; i++) {
      await waitFor(() => upstream.held === 1);
      upstream.releaseOne();
    }
    expect((await Promise.all(answers.map((sent) => sent.done))).map((answer) => answer.status)).toEqual(Array(7).fill(200));
    expect(upstream.arrived).toEqual(['a0', 'a1', 'b1', 'c1', 'a2', 'b2', 'a3']);
    expect(upstream.peak).toBe(1);
    expect(upstream.headers[1]['x-tenant-id']).toBe('a');
  });

  it('serves a trusted caller’s higher class first, gives an untrusted one the middle class, and never forwards the header', async () => {
    const upstream = await held();
    const gw = await gateway({
      upstreams: [{ url: upstream.url }],
      admission: { maxInflightPerRank: 1, priority: { trust: (req) => req.socket.remoteAddress === '127.0.0.2' } },
    });
    const answers = [await sendInOrder(gw, upstream, 'first')];
    answers.push(await sendInOrder(gw, upstream, 'low', { 'x-priority': 'low' }, '127.0.0.2'));
    answers.push(await sendInOrder(gw, upstream, 'untrusted-high', { 'x-priority': 'high' }, '127.0.0.3'));
    answers.push(await sendInOrder(gw, upstream, 'high', { 'x-priority': 'high' }, '127.0.0.2'));
    expect(await depth(gw, 'high')).toBe(1);
    expect(await depth(gw, 'normal')).toBe(1);
    expect(await depth(gw, 'low')).toBe(1);
    for (let i = 0; i < 4; i++) {
      await waitFor(() => upstream.held === 1);
      upstream.releaseOne();
    }
    await Promise.all(answers.map((sent) => sent.done));
    expect(upstream.arrived).toEqual(['first', 'high', 'untrusted-high', 'low']);
    expect(upstream.headers.every((headers) => headers['x-priority'] === undefined)).toBe(true);
  });

  it('makes a hinted request wait for its rank while an unhinted one takes the free rank', async () => {
    const upstream = await held();
    const gw = await gateway({ upstreams: [{ url: upstream.url, dataParallelSize: 2 }], hints: { trust: true }, admission: { maxInflightPerRank: 1 } });
    const first = await sendInOrder(gw, upstream, 'r0', { 'x-data-parallel-rank': '0' });
    const hinted = await sendInOrder(gw, upstream, 'r0-again', { 'x-data-parallel-rank': '0' });
    expect(await depth(gw)).toBe(1);
    const free = await sendInOrder(gw, upstream, 'any');
    expect(upstream.arrived).toEqual(['r0', 'any']);
    expect(upstream.headers[1]['x-data-parallel-rank']).toBe('1');
    upstream.releaseOne();
    await waitFor(() => upstream.arrived.length === 3);
    expect(upstream.headers[2]['x-data-parallel-rank']).toBe('0');
    upstream.releaseAll();
    await waitFor(() => upstream.held === 0 && upstream.arrived.length === 3);
    upstream.releaseAll();
    expect((await Promise.all([first.done, hinted.done, free.done])).map((answer) => answer.status)).toEqual([200, 200, 200]);
  });

  it('gives a freed slot to the first waiter that can use it: a waiter for a busy model never holds back one for the freed model', async () => {
    const a = await held();
    const b = await held();
    const gw = await gateway({ upstreams: [{ url: a.url, name: 'a', models: ['model-a'] }, { url: b.url, name: 'b', models: ['model-b'] }], admission: { maxInflightPerRank: 1 } });
    const ask = (model: string) => JSON.stringify({ model, prompt: 'hi', max_tokens: 1 });
    const a1 = await sendInOrder(gw, [a, b], 'a1', {}, undefined, ask('model-a'));
    const b1 = await sendInOrder(gw, [a, b], 'b1', {}, undefined, ask('model-b'));
    // a2 waits at the head of the queue for model-a's busy endpoint; b2 waits behind it.
    const a2 = await sendInOrder(gw, [a, b], 'a2', {}, undefined, ask('model-a'));
    const b2 = await sendInOrder(gw, [a, b], 'b2', {}, undefined, ask('model-b'));
    expect(await depth(gw)).toBe(2);
    b.releaseOne();
    await waitFor(() => b.arrived.length === 2, 3000, () => `b2 still waits behind a2: ${b.arrived}`);
    expect(b.arrived).toEqual(['b1', 'b2']);
    expect(a.arrived).toEqual(['a1']);
    expect(await depth(gw)).toBe(1);
    a.releaseOne();
    await waitFor(() => a.arrived.length === 2);
    a.releaseAll();
    b.releaseAll();
    expect((await Promise.all([a1.done, b1.done, a2.done, b2.done])).map((answer) => answer.status)).toEqual([200, 200, 200, 200]);
  });

  it('keeps a hinted request in its model’s pool: it waits for its rank there, never taking that rank of another model', async () => {
    const a = await held();
    const b = await held();
    const gw = await gateway({ upstreams: [{ url: a.url, name: 'a', models: ['model-a'] }, { url: b.url, name: 'b', models: ['model-b'] }], hints: { trust: true }, admission: { maxInflightPerRank: 1 } });
    const body = JSON.stringify({ model: 'model-a', prompt: 'hi', max_tokens: 1 });
    const first = await sendInOrder(gw, [a, b], 'first', { 'x-data-parallel-rank': '0' }, undefined, body);
    const second = await sendInOrder(gw, [a, b], 'second', { 'x-data-parallel-rank': '0' }, undefined, body);
    expect(b.arrived).toEqual([]);
    expect(await depth(gw)).toBe(1);
    a.releaseOne();
    await waitFor(() => a.arrived.length === 2);
    a.releaseAll();
    expect((await Promise.all([first.done, second.done])).map((answer) => answer.status)).toEqual([200, 200]);
    expect(b.arrived).toEqual([]);
  });

  it('answers 429 RateLimitError with an integer Retry-After when the queue or a tenant’s share is full', async () => {
    const upstream = await held();
    const gw = await gateway({ upstreams: [{ url: upstream.url }], admission: { maxInflightPerRank: 1, tenant: { header: 'x-tenant-id', trust: true }, queue: { maxLength: 2, maxPerTenant: 1 } } });
    const running = await sendInOrder(gw, upstream, 'run', { 'x-tenant-id': 'a' });
    const waiting = await sendInOrder(gw, upstream, 'wait', { 'x-tenant-id': 'a' });
    const share = await exchange(gw.url, { headers: { 'x-tenant-id': 'a' } });
    expect(share.status).toBe(429);
    expect(JSON.parse(share.body)).toEqual({ error: { message: expect.stringContaining('This tenant already has 1'), type: 'RateLimitError', param: null, code: 429 } });
    expect(share.headers['retry-after']).toMatch(/^[1-9][0-9]*$/);
    const other = await sendInOrder(gw, upstream, 'other', { 'x-tenant-id': 'b' });
    const full = await exchange(gw.url, { headers: { 'x-tenant-id': 'c' } });
    expect(full.status).toBe(429);
    expect(JSON.parse(full.body).error).toEqual(expect.objectContaining({ type: 'RateLimitError', message: expect.stringContaining('queue is full') }));
    expect(Number(full.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(await outcome(gw, 'queue_full')).toBe(2);
    upstream.releaseOne();
    await waitFor(() => upstream.arrived.length === 2);
    upstream.releaseOne();
    await waitFor(() => upstream.arrived.length === 3);
    upstream.releaseAll();
    await Promise.all([running.done, waiting.done, other.done]);
  });

  it('answers 503 past queue.timeoutMs, and takes a client that leaves out at once, never forwarding it', async () => {
    const upstream = await held();
    const gw = await gateway({ upstreams: [{ url: upstream.url }], exposeDecision: true, admission: { maxInflightPerRank: 1, queue: { timeoutMs: 150 } } });
    const running = await sendInOrder(gw, upstream, 'run');
    const late = await exchange(gw.url, { headers: { 'x-label': 'late' } });
    expect(late.status).toBe(503);
    expect(JSON.parse(late.body).error).toEqual(expect.objectContaining({ type: 'ServiceUnavailableError', code: 503 }));
    expect(await outcome(gw, 'timed_out')).toBe(1);

    const leaving = httpRequest(`${gw.url}/v1/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'x-label': 'gone' } });
    leaving.on('error', () => undefined);
    leaving.end('{"model":"m","prompt":"hi"}');
    await waitFor(async () => (await depth(gw)) === 1);
    leaving.destroy();
    await waitFor(async () => (await depth(gw)) === 0 && (await outcome(gw, 'cancelled')) === 1);
    const next = exchange(gw.url, { headers: { 'x-label': 'next' } });
    await waitFor(async () => (await depth(gw)) === 1);
    upstream.releaseOne();
    await waitFor(() => upstream.arrived.length === 2);
    upstream.releaseOne();
    const [first, second] = await Promise.all([running.done, next]);
    expect(upstream.arrived).toEqual(['run', 'next']);
    expect(first.headers['x-dp-router-decision']).toMatch(/; waited_ms=0$/);
    expect(second.headers['x-dp-router-decision']).toMatch(/; waited_ms=[1-9][0-9]*$/);
    const waits = (await gw.registry.getSingleMetric('dp_router_queue_wait_seconds')!.get()).values;
    expect(waits.find((sample) => (sample as { metricName?: string }).metricName === 'dp_router_queue_wait_seconds_count' && sample.labels.priority === 'normal')?.value).toBe(1);
    await waitFor(() => gw.router.endpoints()[0].inflight === 0);
  });

  it('honours the tenant header of trusted callers only: untrusted ones share the default tenant, fresh ids or not', async () => {
    const upstream = await held();
    const trusted = '127.0.0.2';
    const gw = await gateway({
      upstreams: [{ url: upstream.url }],
      admission: { maxInflightPerRank: 1, tenant: { header: 'x-tenant-id', trust: (req) => req.socket.remoteAddress === trusted }, queue: { maxLength: 8, maxPerTenant: 1 } },
    });
    const running = await sendInOrder(gw, upstream, 'run', { 'x-tenant-id': 'a' }, trusted);
    // An untrusted caller waits as the default tenant, whatever id it sends…
    const waiting = await sendInOrder(gw, upstream, 'untrusted-1', { 'x-tenant-id': 'fresh-1' });
    // …so a fresh id per request cannot take a second place past maxPerTenant.
    const refused = await exchange(gw.url, { headers: { 'x-tenant-id': 'fresh-2' } });
    expect(refused.status).toBe(429);
    expect(JSON.parse(refused.body).error.message).toContain('This tenant already has 1');
    // Nor can it spend a trusted tenant's share: 'a' still has its own place.
    const a = await sendInOrder(gw, upstream, 'a-again', { 'x-tenant-id': 'a' }, trusted);
    // A trusted caller's header names its tenant; an untrusted one with a 1 KiB id is not refused for its length.
    const b = await sendInOrder(gw, upstream, 'b', { 'x-tenant-id': 'b' }, trusted);
    const long = await exchange(gw.url, { headers: { 'x-tenant-id': 'x'.repeat(1024) } });
    expect(long.status).toBe(429);
    expect(await depth(gw)).toBe(3);
    for (let i = 0; i < 4; i++) {
      await waitFor(() => upstream.held === 1);
      upstream.releaseOne();
    }
    expect((await Promise.all([running, waiting, a, b].map((sent) => sent.done))).map((answer) => answer.status)).toEqual([200, 200, 200, 200]);
  });

  it('keeps an untrusted caller’s fresh tenant ids inside the one default budget (tenant.trust defaults to hints.trust)', async () => {
    const mock = await startMockVllm({ dataParallelSize: 1 });
    started.push(mock);
    const gw = await gateway({ upstreams: [{ url: mock.url }], admission: { tenant: { header: 'x-tenant-id' }, tokens: { perMinute: 20 } } });
    const body = JSON.stringify({ model: 'mock-model', prompt: 'hello world!', max_tokens: 8 });
    expect((await exchange(gw.url, { body, headers: { 'x-tenant-id': 'victim' } })).status).toBe(200);
    expect((await exchange(gw.url, { body, headers: { 'x-tenant-id': 'fresh-1' } })).status).toBe(200);
    expect((await exchange(gw.url, { body, headers: { 'x-tenant-id': 'fresh-2' } })).status).toBe(429);
    const trusting = await gateway({ upstreams: [{ url: mock.url }], hints: { trust: true }, admission: { tenant: { header: 'x-tenant-id' }, tokens: { perMinute: 20 } } });
    for (const tenant of ['a', 'a', 'b']) expect((await exchange(trusting.url, { body, headers: { 'x-tenant-id': tenant } })).status).toBe(200);
    expect((await exchange(trusting.url, { body, headers: { 'x-tenant-id': 'a' } })).status).toBe(429);
  });

  it('refuses a 1 MB tenant header cleanly, in the vLLM shape, whatever the server allows', async () => {
    const upstream = await held();
    const registry = new Registry();
    const router = dpRouter({ upstreams: [{ url: upstream.url }], metrics: { registry }, logger: false, admission: { tenant: { header: 'x-tenant-id', trust: true } } });
    const app = express();
    app.use(router);
    const server = createServer({ maxHeaderSize: 4 << 20 }, app);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    started.push({ close: () => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()); }) }, router);
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const answer = await exchange(url, { headers: { 'x-tenant-id': 'x'.repeat(1 << 20) } });
    expect(answer.status).toBe(400);
    expect(JSON.parse(answer.body)).toEqual({ error: { message: expect.stringContaining('at most 256'), type: 'BadRequestError', param: 'x-tenant-id', code: 400 } });
    expect(upstream.arrived).toEqual([]);
    // A gateway on Node's default header limit refuses it before the router: 431, not a crash.
    const gw = await gateway({ upstreams: [{ url: upstream.url }], admission: { tenant: { header: 'x-tenant-id', trust: true } } });
    // Raw: Node 24's client may see the reset that follows the 431 before the answer (libuv 1.52).
    const refused = await rawRefusal(gw.url, `GET /v1/models HTTP/1.1\r\nHost: x\r\nx-tenant-id: ${'x'.repeat(1 << 20)}\r\n\r\n`);
    expect(refused.answer).toMatch(/^HTTP\/1\.1 431 /);
  });

  it('spends each tenant’s own token budget from vLLM’s usage (memory store), 429 with Retry-After past it', async () => {
    const mock = await startMockVllm({ dataParallelSize: 1 });
    started.push(mock);
    const gw = await gateway({ upstreams: [{ url: mock.url }], admission: { tenant: { header: 'x-tenant-id', trust: true }, tokens: { perMinute: 20 } } });
    // "hello world!" is 3 tokens to the mock, 8 generated: 11 a request; the second takes tenant a to 22.
    const body = JSON.stringify({ model: 'mock-model', prompt: 'hello world!', max_tokens: 8 });
    const usage = JSON.parse((await exchange(gw.url, { body, headers: { 'x-tenant-id': 'a' } })).body).usage;
    expect(usage.total_tokens).toBe(11);
    expect((await exchange(gw.url, { body, headers: { 'x-tenant-id': 'a' } })).status).toBe(200);
    const over = await exchange(gw.url, { body, headers: { 'x-tenant-id': 'a' } });
    expect(over.status).toBe(429);
    expect(JSON.parse(over.body).error.type).toBe('RateLimitError');
    expect(Number(over.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect((await exchange(gw.url, { body, headers: { 'x-tenant-id': 'b' } })).status).toBe(200);
    expect(await outcome(gw, 'over_budget')).toBe(1);
    // A stream without usage is estimated (prompt bytes / 4 + one token per event): it counts too.
    const stream = JSON.stringify({ model: 'mock-model', prompt: 'hello world!', max_tokens: 8, stream: true });
    expect((await exchange(gw.url, { body: stream, headers: { 'x-tenant-id': 'c' } })).status).toBe(200);
    // Counted when the upstream's answer ended, before the client saw its end.
    expect((await exchange(gw.url, { body, headers: { 'x-tenant-id': 'c' } })).status).toBe(429);
  });
});
