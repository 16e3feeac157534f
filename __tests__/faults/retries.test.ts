import { afterEach, describe, expect, it } from '@jest/globals';
import { request as httpRequest } from 'node:http';
import type { Options } from '../../lib';
import { allIdle, echoUpstreams, exchange, freePort, metricValue, parseExposition, startGateway, sumSamples, type TestGateway, waitFor } from '../helpers';

let gateway: TestGateway | undefined;

afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
});

const echo = echoUpstreams();

/** An address where nothing listens (below the ephemeral range: no other test's listen(0) takes it meanwhile). */
async function deadUrl(): Promise<string> {
  return `http://127.0.0.1:${await freePort()}`;
}

/** Two upstreams serving ranks 0 and 1 each (replicas), the dead one first in round-robin order. */
function pair(a: string, b: string, extra: Partial<Options> = {}): Options {
  return {
    upstreams: [
      { url: a, name: 'a', dataParallelSize: 2 },
      { url: b, name: 'b', dataParallelSize: 2 },
    ],
    policy: 'round-robin',
    outlierDetection: false,
    ...extra,
  };
}

describe('retries', () => {
  it('retries a refused connection on the other upstream, replaying each body byte for byte', async () => {
    const live = await echo();
    gateway = await startGateway(pair(await deadUrl(), live.url, { xfwd: 'append' }));
    const bodies = Array.from({ length: 8 }, (_, index) => JSON.stringify({ prompt: `request ${index} ${'é'.repeat(index * 50)}` }));
    for (const body of bodies) {
      const answer = await exchange(gateway.url, { body, headers: { 'x-forwarded-for': '10.0.0.1' } });
      expect(answer.status).toBe(200);
    }
    expect(live.seen.map((seen) => seen.body.toString('utf8'))).toEqual(bodies);
    // xfwd appends once per try; a retry must not leave the failed try's value behind.
    expect(live.seen.every((seen) => seen.headers['x-forwarded-for'] === '10.0.0.1,127.0.0.1')).toBe(true);
    expect(live.seen.every((seen) => seen.rankHeaders.length === 1)).toBe(true);
    const refused = await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { upstream: 'a', kind: 'connect' });
    expect(refused).toBeGreaterThanOrEqual(1);
    // Each try is a dispatch: the failed ones on `a`, all 8 on `b`.
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { upstream: 'b' })).toBe(8);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { upstream: 'a' })).toBe(refused);
    await waitFor(() => allIdle(gateway!));
    const samples = parseExposition(await gateway.registry.metrics());
    expect(sumSamples(samples, 'dp_router_request_duration_seconds_count')).toBe(8);
  });

  it('with xfwd: true a retry sends the gateway\'s own view once, the client\'s claims dropped', async () => {
    const live = await echo();
    gateway = await startGateway(pair(await deadUrl(), live.url, { xfwd: true }));
    for (let index = 0; index < 4; index++) {
      const answer = await exchange(gateway.url, { headers: { 'x-forwarded-for': '10.0.0.1', 'x-forwarded-proto': 'https' } });
      expect(answer.status).toBe(200);
    }
    const host = new URL(gateway.url).host;
    for (const seen of live.seen) {
      expect(seen.headers).toMatchObject({ 'x-forwarded-for': '127.0.0.1', 'x-forwarded-proto': 'http', 'x-forwarded-host': host });
    }
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { upstream: 'a', kind: 'connect' })).toBeGreaterThanOrEqual(1);
  });

  it('retries a connection reset before any answer', async () => {
    const resetting = await echo();
    const live = await echo();
    resetting.respond = (req) => req.socket.destroy();
    gateway = await startGateway(pair(resetting.url, live.url));
    const answers = await Promise.all(Array.from({ length: 6 }, () => exchange(gateway!.url)));
    expect(answers.map((answer) => answer.status)).toEqual([200, 200, 200, 200, 200, 200]);
    expect(live.seen).toHaveLength(6);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { upstream: 'a', kind: 'reset' })).toBe(resetting.seen.length);
    await waitFor(() => allIdle(gateway!));
  });

  it('moves the in-flight slot to the new endpoint exactly once', async () => {
    const live = await echo();
    let finish: () => void = () => undefined;
    live.respond = (_req, res) => (finish = () => res.end('{}'));
    gateway = await startGateway(pair(await deadUrl(), live.url, { upstreams: [{ url: await deadUrl(), name: 'a' }, { url: live.url, name: 'b' }] }));
    const pending = exchange(gateway.url);
    await waitFor(() => live.seen.length === 1);
    expect(gateway.router.endpoints().map(({ upstream, inflight }) => [upstream, inflight])).toEqual([['a', 0], ['b', 1]]);
    expect(await metricValue(gateway.registry, 'dp_router_inflight_requests')).toBe(1);
    finish();
    expect((await pending).status).toBe(200);
    await waitFor(() => allIdle(gateway!));
    expect(await metricValue(gateway.registry, 'dp_router_inflight_requests')).toBe(0);
  });

  it('keeps a hinted request on its rank: only a replica of that rank on another upstream', async () => {
    const live = await echo();
    gateway = await startGateway(pair(await deadUrl(), live.url, { hints: { trust: true }, policy: 'least-outstanding' }));
    for (let index = 0; index < 4; index++) {
      const answer = await exchange(gateway.url, { headers: { 'x-data-parallel-rank': '1' } });
      expect(answer.status).toBe(200);
      expect(JSON.parse(answer.body).rankHeaders).toEqual(['1']);
    }
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { upstream: 'b', rank: '1', source: 'hint' })).toBe(4);
  });

  it('answers the upstream error when a hinted rank has no replica left', async () => {
    const live = await echo();
    gateway = await startGateway({
      upstreams: [
        { url: await deadUrl(), name: 'a', dataParallelSize: 2 },
        { url: live.url, name: 'b', dataParallelSize: 2, startRank: 2 },
      ],
      hints: { trust: true },
      outlierDetection: false,
    });
    const answer = await exchange(gateway.url, { headers: { 'x-data-parallel-rank': '1' } });
    expect(answer.status).toBe(502);
    expect(JSON.parse(answer.body).error).toMatchObject({ type: 'BadGatewayError', code: 502 });
    expect(live.seen).toHaveLength(0);
  });

  it('never retries once the upstream began to answer: the client sees the stream cut', async () => {
    const dying = await echo();
    const live = await echo();
    dying.respond = (req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"n":1}\n\n', () => setTimeout(() => req.socket.destroy(), 20));
    };
    gateway = await startGateway(pair(dying.url, live.url, { upstreams: [{ url: dying.url, name: 'a' }, { url: live.url, name: 'b' }] }));
    const answer = await exchange(gateway.url);
    expect(answer.status).toBe(200);
    expect(answer.body).toBe('data: {"n":1}\n\n');
    expect(answer.ending).toBe('error');
    expect(live.seen).toHaveLength(0);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { upstream: 'a', kind: 'reset' })).toBe(1);
    await waitFor(() => allIdle(gateway!));
  });

  it('answers 502, not a cut connection, when the upstream dies after its headers but before a byte of body', async () => {
    const dying = await echo();
    dying.respond = (req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'x-upstream': 'yes' });
      res.flushHeaders();
      setTimeout(() => req.socket.destroy(), 20);
    };
    gateway = await startGateway({ upstreams: [{ url: dying.url, name: 'a' }], exposeDecision: true });
    const answer = await exchange(gateway.url);
    expect(answer.status).toBe(502);
    expect(answer.headers['content-type']).toBe('application/json');
    expect(answer.headers['x-upstream']).toBeUndefined();
    expect(answer.headers['x-dp-router-decision']).toBe('upstream=a; rank=0; source=assigned');
    expect(JSON.parse(answer.body).error).toMatchObject({ type: 'BadGatewayError', code: 502 });
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'reset' })).toBe(1);
  });

  it('does not retry a first-byte timeout: the engine may still be working', async () => {
    const stalled = await echo();
    const live = await echo();
    stalled.respond = () => undefined;
    gateway = await startGateway(pair(stalled.url, live.url, { upstreams: [{ url: stalled.url, name: 'a' }, { url: live.url, name: 'b' }], timeouts: { firstByteMs: 100 } }));
    const answer = await exchange(gateway.url);
    expect(answer.status).toBe(504);
    expect(JSON.parse(answer.body).error).toMatchObject({ type: 'GatewayTimeoutError', code: 504 });
    expect(live.seen).toHaveLength(0);
  });

  it('streams a body over retries.maxBodyBytes without retrying it', async () => {
    const live = await echo();
    // Streamed, not buffered: a body `requestBuffering` has read whole is replayed whatever its size.
    gateway = await startGateway(pair(await deadUrl(), live.url, { upstreams: [{ url: await deadUrl(), name: 'a' }, { url: live.url, name: 'b' }], retries: { maxBodyBytes: 16 }, requestBuffering: false }));
    const small = await exchange(gateway.url, { body: '{"prompt":"x"}' });
    expect(small.status).toBe(200);
    const large = await exchange(gateway.url, { body: JSON.stringify({ prompt: 'x'.repeat(100) }) });
    expect(large.status).toBe(502);
    expect(live.seen).toHaveLength(1);
  });

  it('does not retry a chunked body it did not read', async () => {
    const live = await echo();
    // Streamed, not buffered (`requestBuffering` would have read it whole, and then replay it).
    gateway = await startGateway(pair(await deadUrl(), live.url, { upstreams: [{ url: await deadUrl(), name: 'a' }, { url: live.url, name: 'b' }], requestBuffering: false }));
    const status = await new Promise<number>((resolve) => {
      const outgoing = httpRequest(`${gateway!.url}/v1/completions`, { method: 'POST', agent: false, headers: { 'transfer-encoding': 'chunked' } });
      outgoing.on('response', (response) => {
        response.resume();
        response.on('end', () => resolve(response.statusCode!));
      });
      outgoing.write('{"prompt":');
      outgoing.end('"x"}');
    });
    expect(status).toBe(502);
    expect(live.seen).toHaveLength(0);
  });

  it('bounds the tries by retries.attempts, counting every failed one', async () => {
    const dead = await Promise.all([deadUrl(), deadUrl(), deadUrl(), deadUrl()]);
    const options = (attempts: number): Options => ({
      upstreams: dead.map((url, index) => ({ url, name: `u${index}` })),
      outlierDetection: false,
      retries: { attempts },
    });
    gateway = await startGateway(options(3));
    expect((await exchange(gateway.url)).status).toBe(502);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'connect' })).toBe(3);
    await gateway.close();
    gateway = await startGateway({ ...options(3), retries: false });
    expect((await exchange(gateway.url)).status).toBe(502);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'connect' })).toBe(1);
    await waitFor(() => allIdle(gateway!));
  });
});
