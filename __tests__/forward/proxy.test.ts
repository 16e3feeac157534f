import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import express from 'express';
import { Agent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Registry } from 'prom-client';
import { dpRank, type Options } from '../../lib';
import { serve, startGateway, type TestGateway } from '../helpers/app';
import { startEchoUpstream, type EchoUpstream } from '../helpers/echo-upstream';
import { rawRequest } from '../helpers/raw-http';

let upstream: EchoUpstream;
let gateway: TestGateway | undefined;

beforeEach(async () => {
  upstream = await startEchoUpstream();
});
afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
  await upstream.close();
});

const one = (extra: Partial<Options> = {}): Options => ({ upstreams: [{ url: upstream.url, name: 'a', dataParallelSize: 2 }], ...extra });

/** Sends a raw request with `lines` (header lines, `\r\n`-terminated, framing included) and `body`. */
function raw(lines: string, body: string, method = 'POST'): Promise<string> {
  return rawRequest(gateway!.url, `${method} /v1/completions HTTP/1.1\r\nHost: gateway\r\n${lines}\r\n${body}`);
}

describe('hop-by-hop headers on the way up', () => {
  it('removes them and every header Connection names, keeping the router\'s rank header', async () => {
    gateway = await startGateway(one({ policy: 'round-robin' }));
    const answer = await raw(
      'Connection: close, X-data-parallel-rank, X-Secret\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n' +
        'TE: trailers\r\nTrailer: x-t\r\nUpgrade: h2c\r\nProxy-Authorization: Basic eDp5\r\nX-Kept: k\r\nContent-Length: 2\r\n',
      '{}',
    );
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    const seen = upstream.seen[0];
    expect(seen.rankHeaders).toEqual(['0']);
    for (const name of ['x-secret', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'upgrade', 'proxy-authorization']) {
      expect(seen.headers[name]).toBeUndefined();
    }
    // What the gateway's own keep-alive agent says about its connection, nothing of the client's.
    expect(seen.headers.connection).toBe('keep-alive');
    expect(seen.headers['x-kept']).toBe('k');
  });

  it('a Connection header naming the framing cannot smuggle a chunked body past the upstream as a second request', async () => {
    gateway = await startGateway(one());
    const smuggled = 'GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n';
    const chunk = `${smuggled.length.toString(16)}\r\n${smuggled}\r\n0\r\n\r\n`;
    const answer = await raw('Connection: close, Transfer-Encoding, Content-Length\r\nTransfer-Encoding: chunked\r\n', chunk, 'GET');
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    // The next request down the same kept-alive upstream connection would expose a desynchronised one.
    expect(await rawRequest(gateway.url, 'GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')).toMatch(/^HTTP\/1\.1 200 /);
    expect(upstream.seen.map((seen) => `${seen.method} ${seen.url}`)).toEqual(['GET /v1/completions', 'GET /v1/models']);
    expect(upstream.seen[0].body.toString()).toBe(smuggled);
  });
});

describe('hop-by-hop headers on the way down', () => {
  it("drops the upstream's connection headers and honours the client's own Connection", async () => {
    upstream.respond = (_req, res) => {
      res.writeHead(200, { connection: 'close, X-Internal', 'x-internal': 'secret', 'keep-alive': 'timeout=5', 'content-type': 'text/plain' });
      res.end('ok');
    };
    gateway = await startGateway(one());
    const kept = await new Promise<{ headers: Record<string, unknown>; reused: boolean }>((resolve, reject) => {
      const agent = new Agent({ keepAlive: true, maxSockets: 1 });
      const get = (done: (response: IncomingMessage) => void) =>
        httpRequest(`${gateway!.url}/v1/models`, { agent }, (response) => {
          response.resume();
          response.on('end', () => done(response));
        }).on('error', reject).end();
      get((first) => get((second) => {
        agent.destroy();
        resolve({ headers: first.headers, reused: first.socket === second.socket });
      }));
    });
    expect(kept.headers['x-internal']).toBeUndefined();
    expect(kept.headers['keep-alive']).toBeUndefined();
    // The upstream's `close` is about its own connection: the client's stays open.
    expect(kept.headers.connection).toBe('keep-alive');
    expect(kept.reused).toBe(true);
    const closing = await rawRequest(gateway.url, 'GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    expect(closing).toMatch(/\r\nConnection: close\r\n/i);
  });
});

describe('xfwd', () => {
  const forged = { 'x-forwarded-for': '6.6.6.6', 'x-forwarded-host': 'evil.example', 'x-forwarded-proto': 'https', 'x-forwarded-port': '1', forwarded: 'for=6.6.6.6' };
  const post = (headers: Record<string, string>) =>
    new Promise<void>((resolve, reject) => {
      const outgoing = httpRequest(`${gateway!.url}/v1/completions`, { method: 'POST', agent: false, headers }, (response) => {
        response.resume();
        response.on('end', resolve);
      });
      outgoing.on('error', reject);
      outgoing.end('{}');
    });

  it('true: the gateway\'s own view replaces whatever the client claimed', async () => {
    gateway = await startGateway(one({ xfwd: true }));
    await post(forged);
    const host = new URL(gateway.url).host;
    expect(upstream.seen[0].headers).toMatchObject({
      'x-forwarded-for': '127.0.0.1',
      'x-forwarded-host': host,
      'x-forwarded-proto': 'http',
      'x-forwarded-port': host.split(':')[1],
    });
    expect(upstream.seen[0].headers.forwarded).toBeUndefined();
  });

  it("'append': a trusted proxy's values are kept and the peer appended", async () => {
    gateway = await startGateway(one({ xfwd: 'append' }));
    await post(forged);
    expect(upstream.seen[0].headers).toMatchObject({
      'x-forwarded-for': '6.6.6.6,127.0.0.1',
      'x-forwarded-host': 'evil.example',
      'x-forwarded-proto': 'https,http',
      forwarded: 'for=6.6.6.6',
    });
  });

  it('false (the default): the headers pass as they came', async () => {
    gateway = await startGateway(one());
    await post(forged);
    expect(upstream.seen[0].headers).toMatchObject(forged);
  });
});

describe('dpRank and Connection', () => {
  it('takes the rank header out of the Connection header, so a compliant proxy downstream keeps it', async () => {
    const rank = dpRank({ upstreams: [{ url: upstream.url, dataParallelSize: 2 }], metrics: { registry: new Registry() } });
    const app = express();
    app.use(rank);
    app.use((req, res) => {
      res.json({ connection: req.headers.connection ?? null, rank: req.headers['x-data-parallel-rank'] ?? null });
    });
    const server = await serve(app);
    try {
      const answer = await rawRequest(server.url, 'GET / HTTP/1.1\r\nHost: x\r\nConnection: close, X-Data-Parallel-Rank\r\n\r\n');
      expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))).toEqual({ connection: 'close', rank: expect.stringMatching(/^[01]$/) });
    } finally {
      await server.close();
      await rank.close();
    }
  });
});
