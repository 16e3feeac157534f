import { afterEach, describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import WebSocket from 'ws';
import { allIdle, exchange, metricValue, rawRequest, type RawUpstream, startGateway, startRawUpstream, type TestGateway, waitFor } from '../helpers';

let gateway: TestGateway | undefined;
let upstream: RawUpstream | undefined;

afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
  await upstream?.close();
  upstream = undefined;
});

const OK = 'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}';

/**
 * A gateway in front of a raw upstream that answers `/slow` with a plain 200 only once the
 * hostile answer (to any other path) has been dealt with, so the two requests overlap.
 */
async function hostile(answer: string): Promise<{ gateway: TestGateway; upstream: RawUpstream; released: () => void }> {
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  upstream = await startRawUpstream((head) => (head.startsWith('POST /slow ') ? held.then(() => OK) : answer));
  gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'raw' }], retries: false });
  return { gateway, upstream, released: release };
}

/** What vLLM-shaped error body the gateway answers with. */
function errorOf(body: string): { type: string; code: number } {
  return (JSON.parse(body) as { error: { type: string; code: number } }).error;
}

describe('a hostile upstream answer is refused for its request alone', () => {
  it.each([
    ['status 099', 'HTTP/1.1 099 OK\r\nContent-Length: 2\r\n\r\nhi'],
    ['status 000', 'HTTP/1.1 000 OK\r\nContent-Length: 2\r\n\r\nhi'],
    ['status 101 without an upgrade', 'HTTP/1.1 101 Switching Protocols\r\n\r\n'],
    ['101 to an upgrade the gateway did not ask for', 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'],
    ['Transfer-Encoding: gzip', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhi'],
    ['an unknown transfer coding', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\nhi'],
    ['Transfer-Encoding: chunked, chunked', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n'],
    ['Transfer-Encoding: chunked, gzip', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nhi'],
    ['two Content-Length lines', 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi'],
    ['Content-Length with Transfer-Encoding', 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n'],
    ['a status code of four digits', 'HTTP/1.1 1000 OK\r\nContent-Length: 2\r\n\r\nhi'],
    ['a control character in a header value', 'HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 2\r\n\r\nhi'],
  ])('%s: one 502 counted as reset, the slot released, a concurrent request served', async (_name, answer) => {
    const { gateway, released } = await hostile(answer);
    const concurrent = exchange(gateway.url, { path: '/slow' });
    await waitFor(() => upstream!.seen.length === 1);
    const bad = await exchange(gateway.url);
    released();
    expect(bad.status).toBe(502);
    expect(bad.headers['content-type']).toBe('application/json');
    expect(errorOf(bad.body)).toEqual({ type: 'BadGatewayError', code: 502, message: expect.any(String), param: null } as never);
    const good = await concurrent;
    expect(good).toMatchObject({ status: 200, body: '{"ok":true}', ending: 'end' });
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'reset' })).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total')).toBe(1);
    await waitFor(() => allIdle(gateway));
    expect(await metricValue(gateway.registry, 'dp_router_inflight_requests')).toBe(0);
  });
});

describe('upgrades', () => {
  it("a client's Upgrade offer is not forwarded; an upstream that switches protocols anyway gets the client a 502", async () => {
    const { gateway, upstream, released } = await hostile('HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n');
    released();
    // What `curl --http2` sends over cleartext: the server may ignore the offer.
    const answer = await exchange(gateway.url, { headers: { connection: 'Upgrade, HTTP2-Settings', upgrade: 'h2c', 'http2-settings': 'AAMAAABkAAQCAAAAAAIAAAAA' } });
    expect(upstream.seen[0].head).not.toMatch(/^(upgrade|http2-settings):/im);
    expect(upstream.seen[0].head).not.toMatch(/^connection:.*upgrade/im);
    expect(answer.status).toBe(502);
    expect(errorOf(answer.body)).toMatchObject({ type: 'BadGatewayError', code: 502 });
    await waitFor(() => allIdle(gateway));
  });

  it('a WebSocket handshake gets a clear 501 from the gateway, the slot released, nothing sent upstream', async () => {
    const { gateway, upstream, released } = await hostile(OK);
    released();
    const client = new WebSocket(`${gateway.url.replace('http:', 'ws:')}/v1/realtime`);
    const refusal = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      client.on('open', () => reject(new Error('the handshake succeeded')));
      client.on('error', () => undefined);
      client.on('unexpected-response', (_request, response) => {
        let body = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => (body += chunk));
        response.on('end', () => resolve({ status: response.statusCode ?? 0, body }));
      });
    });
    client.terminate();
    expect(refusal.status).toBe(501);
    expect(JSON.parse(refusal.body)).toEqual({ error: { type: 'NotImplementedError', code: 501, param: 'upgrade', message: expect.stringContaining('WebSocket') } });
    expect(upstream.seen).toHaveLength(0);
    await waitFor(() => allIdle(gateway));
  });
});

describe('what can be relayed faithfully is relayed', () => {
  it.each([
    ['\\x01', '\x01'],
    ['ESC', '\x1b'],
    ['DEL', '\x7f'],
  ])('a reason phrase with %s: the status and body kept, the phrase replaced by the standard one', async (_name, char) => {
    const { gateway, released } = await hostile(`HTTP/1.1 201 Cre${char}ated\r\nContent-Length: 2\r\n\r\nhi`);
    released();
    const answer = await exchange(gateway.url);
    expect(answer).toMatchObject({ status: 201, body: 'hi', ending: 'end' });
    expect(await rawRequest(gateway.url, 'GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')).toMatch(/^HTTP\/1\.1 201 Created\r\n/);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total')).toBe(0);
    await waitFor(() => allIdle(gateway));
  });

  it('an upstream 503 with a control character in its reason phrase still reaches the client as 503, counted status_5xx', async () => {
    const { gateway, released } = await hostile('HTTP/1.1 503 Busy\x1b[31m\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}');
    released();
    expect(await exchange(gateway.url)).toMatchObject({ status: 503, body: '{}' });
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'status_5xx' })).toBe(1);
  });

  it('103 Early Hints followed by the answer: the answer is relayed', async () => {
    const { gateway, released } = await hostile(`HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n${OK}`);
    released();
    expect(await exchange(gateway.url)).toMatchObject({ status: 200, body: '{"ok":true}', ending: 'end' });
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total')).toBe(0);
  });

  it('a chunked answer is relayed, re-framed by the gateway', async () => {
    const { gateway, released } = await hostile('HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n');
    released();
    expect(await exchange(gateway.url)).toMatchObject({ status: 200, body: 'hi', ending: 'end' });
  });

  it('a status above 599 the gateway can write is relayed, counted status_5xx', async () => {
    const { gateway, released } = await hostile('HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\nhi');
    released();
    expect(await exchange(gateway.url)).toMatchObject({ status: 999, body: 'hi' });
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'status_5xx' })).toBe(1);
  });

  it('a Latin-1 byte in a header value or reason phrase passes (both are legal obs-text)', async () => {
    const { gateway, released } = await hostile('HTTP/1.1 200 \xc4K\r\nX-A: a\xffb\r\nContent-Length: 2\r\n\r\nhi');
    released();
    const answer = await exchange(gateway.url);
    expect(answer).toMatchObject({ status: 200, body: 'hi' });
    expect(answer.headers['x-a']).toBe('a\xffb');
  });
});

describe('properties over hostile answers', () => {
  /** Bytes an upstream may put on a status or header line, the line break aside. */
  const lineByte = fc.integer({ min: 0, max: 0xff }).filter((code) => code !== 0x0a && code !== 0x0d).map((code) => String.fromCharCode(code));
  const answer = fc.record({
    status: fc.integer({ min: 0, max: 999 }).map((code) => String(code).padStart(3, '0')),
    reason: fc.string({ unit: fc.oneof({ weight: 4, arbitrary: fc.constantFrom('O', 'K', ' ') }, { weight: 1, arbitrary: lineByte }), maxLength: 8 }),
    value: fc.string({ unit: fc.oneof({ weight: 4, arbitrary: fc.constantFrom('v', ' ', ';') }, { weight: 1, arbitrary: lineByte }), maxLength: 8 }),
    framing: fc.constantFrom('Content-Length: 2', 'Transfer-Encoding: chunked', 'Transfer-Encoding: gzip', 'Connection: close'),
  });

  it('any answer is relayed as sent or refused with one 502, counted once, and the gateway stays up', async () => {
    let next = '';
    upstream = await startRawUpstream(() => next);
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'raw' }], retries: false, outlierDetection: false });
    const live = gateway;
    await fc.assert(
      fc.asyncProperty(answer, async ({ status, reason, value, framing }) => {
        const body = framing === 'Transfer-Encoding: chunked' ? '2\r\nhi\r\n0\r\n\r\n' : 'hi';
        next = `HTTP/1.1 ${status} ${reason}\r\nX-Value: ${value}\r\n${framing}\r\n\r\n${body}`;
        const before = await metricValue(live.registry, 'dp_router_upstream_errors_total', { kind: 'reset' });
        const got = await exchange(live.url);
        const refused = got.status === 502 && got.body.includes('"BadGatewayError"');
        if (!refused) expect(got.status).toBe(Number(status));
        expect(await metricValue(live.registry, 'dp_router_upstream_errors_total', { kind: 'reset' })).toBe(before + (refused ? 1 : 0));
        await waitFor(() => allIdle(live));
      }),
      { numRuns: 150 },
    );
  });
});
