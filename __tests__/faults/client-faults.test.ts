import { afterEach, describe, expect, it } from '@jest/globals';
import express from 'express';
import { request as httpRequest, type ServerResponse } from 'node:http';
import { dpRouter } from '../../lib';
import { allIdle, type EchoUpstream, exchange, metricValue, rawRefusal, rawRequest, serve, sleep, startEchoUpstream, startGateway, type TestGateway, waitFor } from '../helpers';

let gateway: TestGateway | undefined;
let upstream: EchoUpstream;

afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
  await upstream?.close();
});

/** An upstream stream that writes one event every `everyMs` until the client goes; records when its response closed. */
function streamForever(everyMs: number) {
  const closed: Array<{ finished: boolean }> = [];
  upstream.respond = (_req, res: ServerResponse) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const timer = setInterval(() => res.write('data: {"n":1}\n\n'), everyMs);
    res.on('close', () => {
      clearInterval(timer);
      closed.push({ finished: res.writableFinished });
    });
  };
  return closed;
}

describe('client faults', () => {
  it('destroys the upstream request and releases in-flight when the client leaves mid-stream, blaming no one', async () => {
    upstream = await startEchoUpstream();
    const closed = streamForever(5);
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a' }], outlierDetection: { consecutiveFailures: 1 } });
    for (let index = 0; index < 5; index++) {
      await new Promise<void>((resolve) => {
        const outgoing = httpRequest(`${gateway!.url}/v1/completions`, { method: 'POST', agent: false });
        outgoing.on('response', (response) => response.once('data', () => (outgoing.destroy(), resolve())));
        outgoing.on('error', () => undefined);
        outgoing.end('{"stream":true}');
      });
    }
    await waitFor(() => closed.length === 5);
    expect(closed.every((close) => !close.finished)).toBe(true);
    await waitFor(() => allIdle(gateway!));
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total')).toBe(0);
    expect(gateway.router.endpoints()[0].healthy).toBe(true);
  });

  it('destroys the upstream request when the client leaves before the first byte (during prefill)', async () => {
    upstream = await startEchoUpstream();
    const closed: boolean[] = [];
    upstream.respond = (_req, res) => res.on('close', () => closed.push(res.writableFinished));
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a' }] });
    const outgoing = httpRequest(`${gateway.url}/v1/completions`, { method: 'POST', agent: false, headers: { 'content-length': 2 } });
    outgoing.on('error', () => undefined);
    outgoing.end('{}');
    await waitFor(() => upstream.seen.length === 1);
    expect(gateway.router.endpoints()[0].inflight).toBe(1);
    outgoing.destroy();
    await waitFor(() => closed.length === 1);
    expect(closed).toEqual([false]);
    await waitFor(() => allIdle(gateway!));
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total')).toBe(0);
  });

  it('serves a slow reader completely, with back-pressure, and releases in-flight at the end', async () => {
    upstream = await startEchoUpstream();
    const chunk = 'x'.repeat(64 * 1024);
    upstream.respond = (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      let sent = 0;
      const pump = () => {
        while (sent < 64) {
          sent++;
          if (!res.write(chunk)) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
    };
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a' }] });
    const received = await new Promise<number>((resolve, reject) => {
      const outgoing = httpRequest(`${gateway!.url}/v1/completions`, { method: 'POST', agent: false });
      outgoing.on('response', (response) => {
        let bytes = 0;
        response.pause();
        const read = () => {
          let data: Buffer | null;
          while ((data = response.read() as Buffer | null) !== null) bytes += data.length;
          if (!response.readableEnded) setTimeout(read, 5);
        };
        response.on('readable', () => undefined);
        response.on('end', () => resolve(bytes));
        setTimeout(read, 50);
      });
      outgoing.on('error', reject);
      outgoing.end('{}');
    });
    expect(received).toBe(64 * chunk.length);
    await waitFor(() => allIdle(gateway!));
  });

  it('answers 400 for malformed JSON and 413 for an oversized body where the body is read', async () => {
    upstream = await startEchoUpstream();
    gateway = await startGateway({
      upstreams: [{ url: upstream.url, name: 'a', dataParallelSize: 2 }],
      hints: { trust: true, bodyField: 'data_parallel_rank' },
      maxBodyBytes: 1024,
    });
    for (const body of ['{"prompt": "x"', '{"a":1}}', '\u0000', 'nul']) {
      const answer = await exchange(gateway.url, { body });
      expect(answer.status).toBe(400);
      expect(JSON.parse(answer.body).error).toMatchObject({ type: 'BadRequestError', code: 400 });
    }
    const large = await exchange(gateway.url, { body: JSON.stringify({ prompt: 'x'.repeat(2000) }) });
    expect(large.status).toBe(413);
    expect(JSON.parse(large.body).error).toMatchObject({ code: 413 });
    expect(upstream.seen).toHaveLength(0);
    await waitFor(() => allIdle(gateway!));
  });

  it('survives absurd headers: oversized, hundreds of hint copies, a 10 kB hint', async () => {
    upstream = await startEchoUpstream();
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a', dataParallelSize: 4 }], hints: { trust: true, onInvalid: 'reject' } });
    const huge = await rawRequest(gateway.url, `GET /v1/models HTTP/1.1\r\nHost: x\r\nx-junk: ${'a'.repeat(20_000)}\r\nConnection: close\r\n\r\n`);
    expect(huge).toMatch(/^HTTP\/1\.1 431 /);
    const copies = Array.from({ length: 300 }, (_, index) => `X-Data-Parallel-Rank: ${index % 4}\r\n`).join('');
    expect(await rawRequest(gateway.url, `GET /v1/models HTTP/1.1\r\nHost: x\r\n${copies}Connection: close\r\n\r\n`)).toMatch(/^HTTP\/1\.1 400 /);
    const long = await exchange(gateway.url, { method: 'GET', path: '/v1/models', headers: { 'x-data-parallel-rank': '1'.repeat(10_000) } });
    expect(long.status).toBe(400);
    expect(long.body).not.toContain('1111111111');
    expect(upstream.seen).toHaveLength(0);
    expect((await exchange(gateway.url, { headers: { 'x-data-parallel-rank': '3' } })).status).toBe(200);
  });

  it('answers 431 to headers past the first 64 KiB read, and keeps serving', async () => {
    // Node answers these itself, before Express, and closes with request bytes unread: the
    // client gets the whole 431, then a reset (which Node 24's libuv reports; see rawRefusal).
    upstream = await startEchoUpstream();
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a' }] });
    const huge = await rawRefusal(gateway.url, `GET /v1/models HTTP/1.1\r\nHost: x\r\nx-junk: ${'a'.repeat(200_000)}\r\n\r\n`);
    expect(huge.answer).toBe('HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n');
    expect(upstream.seen).toHaveLength(0);
    expect((await exchange(gateway.url)).status).toBe(200);
    expect(allIdle(gateway)).toBe(true);
  });

  it('keeps a client that leaves while its body is being buffered from holding a slot', async () => {
    upstream = await startEchoUpstream();
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a' }] });
    const arrived = new Promise<void>((resolve) => gateway!.server.once('request', () => setImmediate(resolve)));
    const outgoing = httpRequest(`${gateway.url}/v1/completions`, { method: 'POST', agent: false, headers: { 'content-length': 1000 } });
    outgoing.on('error', () => undefined);
    outgoing.write('{"prompt":"');
    await arrived;
    // requestBuffering: the slot is taken once the body has arrived, not while it is buffered.
    expect(gateway.router.endpoints()[0].inflight).toBe(0);
    outgoing.destroy();
    await waitFor(() => allIdle(gateway!));
    await sleep(20);
    expect(upstream.seen).toHaveLength(0);
  });

  it('holds no slot for a client that left before the router ran (an async middleware in front)', async () => {
    upstream = await startEchoUpstream();
    const router = dpRouter({ upstreams: [{ url: upstream.url, name: 'a' }], metrics: false });
    const app = express();
    let reached!: () => void;
    const clientGone = new Promise<void>((resolve) => (reached = resolve));
    // An authentication step that takes its time: the client gives up meanwhile.
    app.use((_req, res, next) => {
      reached();
      res.once('close', () => setImmediate(next));
    });
    app.use(router);
    const served = await serve(app);
    try {
      const outgoing = httpRequest(`${served.url}/v1/completions`, { method: 'POST', agent: false });
      outgoing.on('error', () => undefined);
      outgoing.end('{}');
      await clientGone;
      outgoing.destroy();
      await sleep(100);
      expect(router.endpoints()[0].inflight).toBe(0);
      expect(upstream.seen).toHaveLength(0);
    } finally {
      await served.close();
      await router.close();
    }
  });
});
