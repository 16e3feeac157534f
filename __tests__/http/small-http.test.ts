import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { afterEach, describe, expect, it } from '@jest/globals';
import { fetchText } from '../../lib/upstreams/scrape';
import { smallRequest, SmallHttpError, type SmallHttpFailure } from '../../lib/http/small-http';

const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

async function serve(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ url: string; sockets: Socket[] }> {
  const server = createServer(handler);
  const sockets: Socket[] = [];
  server.on('connection', (socket) => sockets.push(socket));
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, sockets };
}

async function failureOf(answer: Promise<unknown>): Promise<SmallHttpFailure> {
  const error = await answer.then(
    () => undefined,
    (reason: unknown) => reason,
  );
  expect(error).toBeInstanceOf(SmallHttpError);
  return (error as SmallHttpError).failure;
}

/** Writes a byte every 20 ms: never idle long enough for a socket timeout. */
function trickle(res: ServerResponse): void {
  res.writeHead(200, { 'content-type': 'text/plain' });
  const timer = setInterval(() => res.write('#'), 20);
  res.on('close', () => clearInterval(timer));
}

describe('smallRequest: the one client of scrapes, probes and /tokenize', () => {
  it('sends a POST body whole and reads the answer', async () => {
    const { url } = await serve((req, res) => {
      let text = '';
      req.on('data', (chunk: Buffer) => (text += chunk.toString()));
      req.on('end', () => res.end(`${req.method} ${req.headers['content-length']} ${text}`));
    });
    const answer = await smallRequest(`${url}/tokenize`, { method: 'POST', body: '{"prompt":"é"}', deadlineMs: 1000, maxBytes: 100 });
    expect(answer.status).toBe(200);
    expect(answer.body.toString()).toBe('POST 15 {"prompt":"é"}');
  });

  it('ends an answer trickled past its deadline, although bytes keep coming', async () => {
    const { url } = await serve((_req, res) => trickle(res));
    const started = Date.now();
    expect(await failureOf(smallRequest(url, { deadlineMs: 150, maxBytes: 1 << 20 }))).toBe('timeout');
    // The scrape of /metrics too: a socket timeout alone would wait for ever.
    await expect(fetchText(`${url}/metrics`, 150)).rejects.toThrow(/did not answer within 150 ms/);
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it('refuses an answer past maxBytes and closes its connection', async () => {
    let closed!: Promise<void>;
    const { url } = await serve((_req, res) => {
      closed = new Promise((resolve) => res.on('close', resolve));
      res.writeHead(200);
      res.write(Buffer.alloc(64 * 1024));
      res.write(Buffer.alloc(64 * 1024));
    });
    expect(await failureOf(smallRequest(url, { deadlineMs: 5_000, maxBytes: 1000 }))).toBe('too-large');
    await closed;
  });

  it('tells an answer cut short from a refused connection', async () => {
    // Closed mid-body with a FIN: a reset (RST) right after the head may reach the client before
    // it has read the head (Node 24's libuv reports the reset first), and that is a refusal.
    const { url } = await serve((_req, res) => {
      res.writeHead(200, { 'content-length': '1000' });
      res.write('partial', () => res.socket?.destroy());
    });
    expect(await failureOf(smallRequest(url, { deadlineMs: 5_000, maxBytes: 1 << 20 }))).toBe('cut-short');
    expect(await failureOf(smallRequest('http://127.0.0.1:1/health', { deadlineMs: 5_000, maxBytes: 10 }))).toBe('network');
  });

  it('fails an unwanted status at its head, without waiting for a body that never ends', async () => {
    const { url } = await serve((_req, res) => {
      res.writeHead(500);
      res.write('still going');
    });
    const error = await smallRequest(url, { deadlineMs: 10_000, maxBytes: 10 }).catch((reason: SmallHttpError) => reason);
    expect(error).toMatchObject({ failure: 'status', status: 500, message: `${url} answered 500` });
    const passes = (status: number) => status >= 200 && status < 300;
    const { url: empty } = await serve((_req, res) => res.writeHead(204).end());
    expect((await smallRequest(empty, { deadlineMs: 1000, maxBytes: 0, drain: true, accept: passes })).status).toBe(204);
  });

  it("drains a probe's answer, and opens a fresh connection for each, closed after", async () => {
    const seen: Array<string | undefined> = [];
    const { url, sockets } = await serve((req, res) => {
      seen.push(req.headers.connection);
      res.end('x'.repeat(4096));
    });
    for (let i = 0; i < 2; i++) {
      const answer = await smallRequest(`${url}/health`, { deadlineMs: 1000, maxBytes: 0, drain: true, connection: 'fresh' });
      expect(answer.body.length).toBe(0);
    }
    expect(sockets).toHaveLength(2);
    expect(seen).toEqual(['close', 'close']);
  });

  it('stops on abort, before or during the exchange', async () => {
    const { url } = await serve((_req, res) => trickle(res));
    const controller = new AbortController();
    const pending = smallRequest(url, { deadlineMs: 10_000, maxBytes: 1 << 20, signal: controller.signal });
    setTimeout(() => controller.abort(), 50);
    expect(await failureOf(pending)).toBe('aborted');
    expect(await failureOf(smallRequest(url, { deadlineMs: 10_000, maxBytes: 10, signal: controller.signal }))).toBe('aborted');
  });
});
