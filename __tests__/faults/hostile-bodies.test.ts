import { afterEach, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import path from 'node:path';
import { promisify } from 'node:util';
import { metricValue, startGateway, type TestGateway } from '../helpers/app';
import { startEchoUpstream, type EchoUpstream } from '../helpers/echo-upstream';
import { REPO } from '../helpers/prometheus';
import { allIdle, exchange, waitFor } from '../helpers';

let gateway: TestGateway | undefined;
let upstream: EchoUpstream | undefined;
const cleanups: Array<() => Promise<void> | void> = [];

afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
  await upstream?.close();
  upstream = undefined;
  for (const cleanup of cleanups.splice(0)) await cleanup();
});

const MiB = 1024 * 1024;

/** `{"model":"m","messages":[[],[],…]}` of `size` bytes: decoded whole, about 13 times its size. */
function hostileBody(size: number): Buffer {
  const head = '{"model":"m","messages":[';
  return Buffer.from(`${head}${'[],'.repeat(Math.floor((size - head.length - 4) / 3))}[]]}`);
}

const post = (body: Buffer, headers: Record<string, string> = {}) =>
  exchange(gateway!.url, { path: '/v1/chat/completions', body, headers: { 'content-length': String(body.length), ...headers } });

/** Holds every upstream answer until `release()`. */
function holdAnswers(target: EchoUpstream) {
  const held: ServerResponse[] = [];
  target.respond = (_req, res) => held.push(res);
  return {
    held,
    release: () => {
      for (const res of held.splice(0)) res.end('{}');
    },
  };
}

describe('hostile 16 MiB bodies', () => {
  it('holds no parse tree after the decision: heap per request in flight stays far below the body (bench/body-heap.ts)', async () => {
    // One process per shape, side by side: each measures its own heap, and jest uses one core.
    const runs = ['junk', 'messages'].map((shape) =>
      promisify(execFile)(process.execPath, ['--expose-gc', '--import', 'tsx', path.join('bench', 'body-heap.ts'), '--requests', '4', '--shape', shape], {
        cwd: REPO,
        timeout: 300_000,
      }),
    );
    for (const { stdout } of await Promise.all(runs)) {
      const held = Number(/heap held per request (-?[\d.]+) MiB/.exec(stdout)?.[1]);
      expect(stdout).toContain('in flight=4/4');
      // Before: 213 MiB per request, the whole decoded tree kept on the request's state.
      expect(held).toBeLessThan(4);
    }
  }, 660_000);

  it('bounds the bodies held by all requests: 503 past maxBufferedBytes, 413 for one that never fits, released however a request ends', async () => {
    upstream = await startEchoUpstream();
    const { held, release } = holdAnswers(upstream);
    gateway = await startGateway({
      upstreams: [{ url: upstream.url, dataParallelSize: 2 }],
      policy: 'prefix-aware',
      maxBodyBytes: 32 * MiB,
      maxBufferedBytes: 20 * MiB,
    });
    const body = hostileBody(16 * MiB);
    const first = post(body);
    await waitFor(() => held.length === 1, 30_000);

    const refused = await post(body);
    expect(refused.status).toBe(503);
    expect(refused.headers['retry-after']).toBe('1');
    expect(JSON.parse(refused.body).error).toMatchObject({ type: 'ServiceUnavailableError', param: null, code: 503 });
    // A chunked body is counted as it arrives.
    const chunked = await exchange(gateway.url, { path: '/v1/chat/completions', body: hostileBody(8 * MiB), headers: { 'transfer-encoding': 'chunked' } });
    expect(chunked.status).toBe(503);
    const never = await post(hostileBody(24 * MiB));
    expect(never.status).toBe(413);
    expect(JSON.parse(never.body).error).toMatchObject({ type: 'RequestEntityTooLargeError', code: 413 });
    expect(upstream.seen).toHaveLength(1);

    // Success releases: the next one fits again.
    release();
    expect((await first).status).toBe(200);
    await waitFor(() => allIdle(gateway!));
    const probe = hostileBody(5 * MiB);
    const again = post(body);
    await waitFor(() => held.length === 1, 30_000);
    expect((await post(probe)).status).toBe(503);
    release();
    expect((await again).status).toBe(200);

    // A client that leaves mid-body releases too. `100 Continue` comes once the router has
    // taken the declared length from the budget.
    upstream.respond = undefined;
    const socket = await leaveMidBody(gateway.url, body.length, body.subarray(0, MiB));
    socket.destroy();
    await waitFor(async () => (await post(probe)).status === 200, 10_000);
    await waitFor(() => allIdle(gateway!));
  }, 120_000);

  it('routes a body whose prompt would cost more to decode than the budget allows as one without a prompt', async () => {
    upstream = await startEchoUpstream();
    gateway = await startGateway({ upstreams: [{ url: upstream.url, dataParallelSize: 2 }], policy: 'prefix-aware', maxBufferedBytes: 20 * MiB });
    const body = hostileBody(16 * MiB);
    expect((await post(body)).status).toBe(200);
    expect(upstream.seen[0].body.equals(body)).toBe(true);
  }, 60_000);

  it('releases the budget when the upstream fails', async () => {
    const dead = await startEchoUpstream();
    await dead.close();
    gateway = await startGateway({ upstreams: [{ url: dead.url }], policy: 'prefix-aware', maxBufferedBytes: 20 * MiB, retries: false });
    const body = hostileBody(16 * MiB);
    for (let index = 0; index < 3; index++) expect((await post(body)).status).toBe(502);
  }, 60_000);
});

describe('bodies held for retries', () => {
  it('count against maxBufferedBytes: past it the body is streamed and the request not retried', async () => {
    const dead = await startEchoUpstream();
    await dead.close();
    upstream = await startEchoUpstream();
    const upstreams = [
      { url: dead.url, name: 'dead' },
      { url: upstream.url, name: 'alive' },
    ];
    const body = Buffer.from(JSON.stringify({ prompt: 'x'.repeat(2000) }));
    // Round-robin starts on the dead upstream: only a retry reaches the live one.
    gateway = await startGateway({ upstreams, policy: 'round-robin', maxBufferedBytes: 4096, outlierDetection: false });
    expect((await exchange(gateway.url, { body })).status).toBe(200);
    await gateway.close();
    gateway = await startGateway({ upstreams, policy: 'round-robin', maxBufferedBytes: 1024, outlierDetection: false });
    expect((await exchange(gateway.url, { body })).status).toBe(502);
    expect(upstream.seen).toHaveLength(1);
  });
});

/** Sends headers with `Expect: 100-continue`, waits for the `100 Continue`, then writes `part` and returns the socket. */
function leaveMidBody(url: string, declared: number, part: Buffer): Promise<Socket> {
  const { port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), '127.0.0.1', () => {
      socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${declared}\r\nExpect: 100-continue\r\n\r\n`);
    });
    socket.once('data', (chunk) => {
      expect(chunk.toString()).toMatch(/^HTTP\/1\.1 100 /);
      socket.write(part, () => resolve(socket));
    });
    socket.on('error', reject);
  });
}

/** An upstream that counts its open connections and the requests whose body never completed. */
async function countingUpstream() {
  const state = { connections: 0, requests: 0, incomplete: 0, server: undefined as unknown as Server, url: '' };
  state.server = createServer((req: IncomingMessage, res: ServerResponse) => {
    state.requests++;
    req.resume();
    req.on('close', () => {
      if (!req.complete) state.incomplete++;
    });
    req.on('end', () => res.end('{}'));
  });
  state.server.on('connection', (socket: Socket) => {
    state.connections++;
    socket.on('close', () => state.connections--);
  });
  await new Promise<void>((resolve) => state.server.listen(0, '127.0.0.1', resolve));
  state.url = `http://127.0.0.1:${(state.server.address() as AddressInfo).port}`;
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        state.server.closeAllConnections();
        state.server.close(() => resolve());
      }),
  );
  return state;
}

/** A client that sends its headers and the start of a body, then one byte every `everyMs`, never finishing. */
function slowWriter(url: string, pathname: string, everyMs: number): Promise<string> {
  const { port } = new URL(url);
  return new Promise((resolve) => {
    let answer = '';
    let timer: NodeJS.Timeout | undefined;
    const socket = connect(Number(port), '127.0.0.1', () => {
      socket.write(`POST ${pathname} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"prompt":"`);
      timer = setInterval(() => socket.write('a'), everyMs);
    });
    const done = () => {
      clearInterval(timer);
      socket.destroy();
      resolve(answer);
    };
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => (answer += chunk));
    socket.on('end', done);
    socket.on('close', done);
    socket.on('error', done);
  });
}

/** The error object of a raw HTTP answer. */
const errorOf = (answer: string) => JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)).error;

describe('slow request bodies', () => {
  it('answers 408 in vLLM shape to 20 bodies streamed past timeouts.bodyMs, closing each upstream request without blaming it', async () => {
    const counting = await countingUpstream();
    // Streamed (`requestBuffering: false`): the upstream requests are open while the bodies trickle.
    gateway = await startGateway({ upstreams: [{ url: counting.url, dataParallelSize: 2 }], timeouts: { bodyMs: 500 }, outlierDetection: { consecutiveFailures: 1 }, requestBuffering: false });
    const answers = await Promise.all(Array.from({ length: 20 }, () => slowWriter(gateway!.url, '/v1/completions', 50)));
    for (const answer of answers) {
      expect(answer).toMatch(/^HTTP\/1\.1 408 /);
      expect(answer.toLowerCase()).toContain('connection: close');
      expect(errorOf(answer)).toMatchObject({ type: 'RequestTimeoutError', param: null, code: 408 });
    }
    expect(counting.requests).toBe(20);
    await waitFor(() => counting.connections === 0 && counting.incomplete === 20);
    await waitFor(() => allIdle(gateway!));
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total')).toBe(0);
    expect(gateway.router.endpoints().every((endpoint) => endpoint.healthy)).toBe(true);
  }, 30_000);

  it('answers 408 to bodies the router reads (prefix-aware) without ever opening an upstream connection', async () => {
    const counting = await countingUpstream();
    gateway = await startGateway({ upstreams: [{ url: counting.url, dataParallelSize: 2 }], policy: 'prefix-aware', timeouts: { bodyMs: 500 } });
    const answers = await Promise.all(Array.from({ length: 5 }, () => slowWriter(gateway!.url, '/v1/completions', 50)));
    for (const answer of answers) expect(errorOf(answer)).toMatchObject({ type: 'RequestTimeoutError', code: 408 });
    expect(counting.requests).toBe(0);
    // A body that arrives in time is unaffected.
    expect((await exchange(gateway.url)).status).toBe(200);
  }, 30_000);
});
