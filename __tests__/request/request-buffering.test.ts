import { describe, expect, it } from '@jest/globals';
import express from 'express';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { dpRouter, OptionError, type Options } from '../../lib';
import { closedAfterEach, closerOf, serve, waitFor } from '../helpers';

const started = closedAfterEach();

/** An upstream that counts the connections it accepted and answers each request once its body has arrived. */
async function countingUpstream() {
  const upstream = { url: '', connections: 0, bodies: [] as Buffer[] };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      upstream.bodies.push(Buffer.concat(chunks));
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"ok":true}');
    });
  });
  server.on('connection', () => upstream.connections++);
  const close = closerOf(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  upstream.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  started.push({ close });
  return upstream;
}

/** A gateway with the router, counting the requests that reached it. */
async function gateway(options: Partial<Options>, upstreamUrl: string) {
  const router = dpRouter({ upstreams: [{ url: upstreamUrl, dataParallelSize: 2 }], policy: 'round-robin', metrics: false, ...options });
  const app = express();
  const seen = { requests: 0 };
  app.use((_req, _res, next) => {
    seen.requests++;
    next();
  });
  app.use(router);
  const served = await serve(app);
  started.push({ close: () => served.close().then(() => router.close()) });
  return { url: served.url, seen };
}

/** A raw client that sends the head and the first bytes of a body, then the rest when told; resolves its answer's status line. */
function trickle(url: string, body: string, framing: 'length' | 'chunked', firstBytes = 1) {
  const { port } = new URL(url);
  const socket: Socket = connect(Number(port), '127.0.0.1');
  socket.on('error', () => undefined);
  const head = `POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n${framing === 'length' ? `Content-Length: ${body.length}` : 'Transfer-Encoding: chunked'}\r\n\r\n`;
  const part = (text: string) => (framing === 'length' ? text : `${text.length.toString(16)}\r\n${text}\r\n`);
  socket.write(head + part(body.slice(0, firstBytes)));
  let answer = '';
  socket.setEncoding('latin1');
  const answered = new Promise<string>((resolve) => {
    socket.on('data', (chunk: string) => {
      answer += chunk;
      if (answer.includes('\r\n\r\n')) resolve(answer.slice(0, answer.indexOf('\r\n')));
    });
    socket.on('close', () => resolve(answer.slice(0, answer.indexOf('\r\n'))));
  });
  started.push({ close: () => void socket.destroy() });
  return {
    answered,
    finish: () => socket.write(part(body.slice(firstBytes)) + (framing === 'chunked' ? '0\r\n\r\n' : '')),
  };
}

/** One complete request through the gateway, answered: everything the gateway did before it has reached the upstream. */
async function controlRequest(url: string): Promise<string> {
  const client = trickle(url, '{"model":"m","prompt":"control"}', 'length', 1000);
  return client.answered;
}

const BODY = `{"model":"m","prompt":"${'slow '.repeat(20)}"}`;

describe('request buffering (streamed mode)', () => {
  it('opens no upstream connection for 100 clients trickling their bodies, and forwards each body once it is complete', async () => {
    const upstream = await countingUpstream();
    const gw = await gateway({}, upstream.url);
    const clients = Array.from({ length: 100 }, (_, index) => trickle(gw.url, BODY, index % 2 === 0 ? 'length' : 'chunked'));
    await waitFor(() => gw.seen.requests === 100, 60_000, () => `${gw.seen.requests} of 100 requests reached the gateway`);
    expect(await controlRequest(gw.url)).toBe('HTTP/1.1 200 OK');
    // Before: one upstream connection per trickling client, held until its body ended.
    expect(upstream.connections).toBe(1);
    for (const client of clients) client.finish();
    const statuses = await Promise.all(clients.map((client) => client.answered));
    expect(statuses.filter((status) => status !== 'HTTP/1.1 200 OK')).toEqual([]);
    expect(upstream.bodies.filter((body) => body.toString() === BODY)).toHaveLength(100);
  }, 90_000);

  it('streams a body larger than requestBuffering.maxBytes (declared or chunked), its first bytes included', async () => {
    const upstream = await countingUpstream();
    const gw = await gateway({ requestBuffering: { maxBytes: 64 } }, upstream.url);
    const declared = trickle(gw.url, BODY, 'length');
    await waitFor(() => upstream.connections === 1, 5000, 'the declared large body was not streamed');
    // A chunked body is buffered up to the bound, then what was read goes first and the rest streams.
    const chunked = trickle(gw.url, BODY, 'chunked', 80);
    await waitFor(() => upstream.connections === 2, 5000, 'the chunked large body was not streamed');
    declared.finish();
    chunked.finish();
    expect(await declared.answered).toBe('HTTP/1.1 200 OK');
    expect(await chunked.answered).toBe('HTTP/1.1 200 OK');
    expect(upstream.bodies.map(String)).toEqual([BODY, BODY]);
  });

  it('streams every body with requestBuffering: false', async () => {
    const upstream = await countingUpstream();
    const gw = await gateway({ requestBuffering: false }, upstream.url);
    const client = trickle(gw.url, BODY, 'length');
    await waitFor(() => upstream.connections === 1, 5000, 'the body was not streamed');
    client.finish();
    expect(await client.answered).toBe('HTTP/1.1 200 OK');
  });

  it('answers a body that never completes with 408 at timeouts.bodyMs without having reached the upstream', async () => {
    const upstream = await countingUpstream();
    const gw = await gateway({ timeouts: { bodyMs: 200 } }, upstream.url);
    const client = trickle(gw.url, BODY, 'length');
    expect(await client.answered).toBe('HTTP/1.1 408 Request Timeout');
    expect(upstream.connections).toBe(0);
  });

  it.each([
    [{ requestBuffering: 'on' }, /requestBuffering/],
    [{ requestBuffering: { maxBytes: 0 } }, /requestBuffering\.maxBytes/],
    [{ requestBuffering: { maxBytes: 1.5 } }, /requestBuffering\.maxBytes/],
    [{ requestBuffering: { maxbytes: 10 } }, /requestBuffering\.maxbytes/],
    [{ requestBuffering: { maxBytes: 2048 }, maxBufferedBytes: 1024 }, /requestBuffering\.maxBytes.*maxBufferedBytes/],
  ])('refuses %j with an OptionError naming the option', (options, message) => {
    expect(() => dpRouter({ upstreams: [{ url: 'http://127.0.0.1:1' }], metrics: false, ...(options as Partial<Options>) })).toThrow(OptionError);
    expect(() => dpRouter({ upstreams: [{ url: 'http://127.0.0.1:1' }], metrics: false, ...(options as Partial<Options>) })).toThrow(message);
  });
});
