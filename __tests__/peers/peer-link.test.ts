import { createSocket } from 'node:dgram';
import { describe, expect, it } from '@jest/globals';
import { startMockVllm } from '../../example-server/mock-vllm';
import type { Options } from '../../lib';
import { decodeDatagram, encodeDatagrams } from '../../lib/peers/peer-datagram';
import { closedAfterEach, freeUdpPort, metricValue, sendDatagrams, sleep, startDnsmasq, startGateway, waitFor, type TestGateway } from '../helpers';
import { answeredBy, rankOf, stream } from './helpers';

const started = closedAfterEach();
const SECRET = 'the replicas share this secret';

/** Two replicas that know each other (the same address list on both, as a deployment would give it). */
/** Whether a datagram (decoded with the replicas' secret) announces one request on rank 1. */
function carriesHeld(message: Buffer): boolean {
  const datagram = decodeDatagram(message, Buffer.from(SECRET));
  return typeof datagram !== 'string' && datagram.records.some((record) => record.key === 'vllm#1' && record.inflight === 1);
}

async function replicas(url: string, a: Partial<Options>, b: Partial<Options>, peers: { heartbeatMs?: number; ttlMs?: number } = {}) {
  const ports = [await freeUdpPort(), await freeUdpPort()];
  const addresses = ports.map((port) => `127.0.0.1:${port}`);
  const warnings: string[] = [];
  const start = async (port: number, options: Partial<Options>) => {
    const gateway = await startGateway({
      upstreams: [{ url, name: 'vllm', dataParallelSize: 2 }],
      peers: { listen: `127.0.0.1:${port}`, addresses, secret: SECRET, ...peers },
      logger: { warn: (message) => warnings.push(message) },
      ...options,
    });
    started.push(gateway);
    return gateway;
  };
  return { a: await start(ports[0], a), b: await start(ports[1], b), ports, warnings };
}

/**
 * Two replicas with fast heartbeats (50 ms, ttl 300 ms) and one request A holds on rank 1 (slow
 * decoding) until it is aborted, once B counts it.
 */
async function heldOnRankOne() {
  const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 1000 });
  started.push(mock);
  const { a, b } = await replicas(mock.url, { hints: { trust: true } }, {}, { heartbeatMs: 50, ttlMs: 300 });
  const held = await stream(a, 'a held prompt', 30, { 'x-data-parallel-rank': '1' });
  await waitFor(() => rankOf(b, 1).peerInflight === 1);
  return { mock, a, b, held };
}

describe('peers', () => {
  it("balance on the requests the other replica sent, and forget them when they end (no count left behind)", async () => {
    // Slow decoding: a request holds its rank until its client leaves.
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 1000 });
    started.push(mock);
    const { a, b } = await replicas(mock.url, { hints: { trust: true } }, { policy: 'least-outstanding' });
    // Two prompts: a second copy of one would be a cache hit, answered at once.
    const held = [await stream(a, 'the first prompt', 30, { 'x-data-parallel-rank': '0' }), await stream(a, 'the second prompt', 30, { 'x-data-parallel-rank': '0' })];
    expect(held.map((request) => request.status)).toEqual([200, 200]);
    await waitFor(() => rankOf(b, 0).peerInflight === 2, 5000, () => `b sees ${JSON.stringify(b.router.endpoints())}`);
    expect(rankOf(b, 1).peerInflight).toBe(0);
    expect(rankOf(b, 0).inflight).toBe(0);
    // B's own counts are level: only the peer's two requests on rank 0 tell it apart.
    const ranks: number[] = [];
    for (let i = 0; i < 3; i++) ranks.push(await answeredBy(b));
    expect(ranks).toEqual([1, 1, 1]);
    for (const request of held) request.abort();
    await waitFor(() => a.router.endpoints().every((endpoint) => endpoint.inflight === 0));
    await waitFor(() => b.router.endpoints().every((endpoint) => endpoint.peerInflight === 0 && endpoint.peerBlocks === 0), 5000, () => `b sees ${JSON.stringify(b.router.endpoints())}`);
    // Once the peer's requests ended, B's ties go to rank 0 again.
    expect(await answeredBy(b)).toBe(0);
  });

  it("announce a prefix-aware request's prefill until its first token, then its slot until its end", async () => {
    const mock = await startMockVllm({ dataParallelSize: 2, prefillMsPerToken: 20, decodeMsPerToken: 150 });
    started.push(mock);
    const { a, b } = await replicas(mock.url, { policy: 'prefix-aware' }, { policy: 'prefix-aware' });
    const request = await stream(a, 'a system prompt shared by many requests, long enough to fill several blocks. '.repeat(6), 8);
    const rank = a.router.endpoints().find((endpoint) => endpoint.inflight === 1)!.rank;
    await waitFor(() => rankOf(b, rank).peerInflight === 1);
    // Before the first token: the whole prompt is uncached on a cold rank (7 blocks of 64 characters).
    expect(rankOf(b, rank).peerBlocks).toBeGreaterThanOrEqual(7);
    expect(rankOf(b, 1 - rank)).toMatchObject({ peerInflight: 0, peerBlocks: 0 });
    const first = await request.first();
    expect(first.done).toBe(false);
    await waitFor(() => rankOf(b, rank).peerBlocks === 0);
    expect(rankOf(b, rank).peerInflight).toBe(1);
    expect(await request.rest()).toContain('data: [DONE]');
    await waitFor(() => rankOf(b, rank).peerInflight === 0);
    expect(b.router.endpoints().map((endpoint) => [endpoint.inflight, endpoint.peerInflight, endpoint.peerBlocks])).toEqual([[0, 0, 0], [0, 0, 0]]);
  });

  it('drop datagrams without the secret, malformed or replayed, warning once per kind, and keep routing', async () => {
    const mock = await startMockVllm({ dataParallelSize: 2 });
    started.push(mock);
    const { b, ports, warnings } = await replicas(mock.url, {}, {});
    const port = ports[1];
    const forged = encodeDatagrams(99, 1, Date.now(), [{ key: 'vllm#0', inflight: 1000, blocks: 1e6 }], Buffer.from('not the replicas secret at all'));
    const garbage = [Buffer.alloc(0), Buffer.from('GET / HTTP/1.1\r\n\r\n'), Buffer.alloc(1300, 0xff)];
    await sendDatagrams(port, [...forged, ...forged, ...garbage, ...garbage]);
    await waitFor(() => warnings.length >= 2);
    await sleep(50);
    expect(warnings.sort()).toEqual([
      'express-dp-router: peers: dropped a datagram without a valid tag (another secret, or not a replica); further ones are only counted (dp_router_peer_datagrams_total).',
      'express-dp-router: peers: dropped a malformed datagram (another version?); further ones are only counted (dp_router_peer_datagrams_total).',
    ]);
    // The forged datagram, and three of garbage (an empty one, an HTTP request, 1,300 bytes), each sent twice.
    expect(await metricValue(b.registry, 'dp_router_peer_datagrams_total', { outcome: 'bad_tag' })).toBe(2);
    expect(await metricValue(b.registry, 'dp_router_peer_datagrams_total', { outcome: 'malformed' })).toBe(6);
    expect(rankOf(b, 0).peerInflight).toBe(0);
    // A genuine announcement counts; the same datagram sent again later does not undo a newer one.
    const secret = Buffer.from(SECRET);
    const older = encodeDatagrams(99, 5, Date.now(), [{ key: 'vllm#0', inflight: 7, blocks: 70 }], secret);
    await sendDatagrams(port, encodeDatagrams(99, 6, Date.now(), [{ key: 'vllm#0', inflight: 3, blocks: 30 }, { key: 'no-such#9', inflight: 5, blocks: 5 }], secret));
    await waitFor(() => rankOf(b, 0).peerInflight === 3);
    await sendDatagrams(port, older);
    await sleep(50);
    expect(rankOf(b, 0)).toMatchObject({ peerInflight: 3, peerBlocks: 30 });
    expect(await answeredBy(b)).toBe(1);
  });

  it('warn when the port is taken, and route on their own counts', async () => {
    const mock = await startMockVllm({ dataParallelSize: 2 });
    started.push(mock);
    const taken = createSocket('udp4');
    await new Promise<void>((resolve) => taken.bind(0, '127.0.0.1', resolve));
    started.push({ close: () => new Promise<void>((resolve) => taken.close(() => resolve())) });
    const warnings: string[] = [];
    const gateway = await startGateway({
      upstreams: [{ url: mock.url, name: 'vllm', dataParallelSize: 2 }],
      peers: { listen: `127.0.0.1:${taken.address().port}`, addresses: ['127.0.0.1:9'], secret: SECRET },
      logger: { warn: (message) => warnings.push(message) },
    });
    started.push(gateway);
    await waitFor(() => warnings.length > 0);
    expect(warnings).toEqual([expect.stringMatching(/^express-dp-router: peers: socket error: bind EADDRINUSE/)]);
    expect([await answeredBy(gateway), await answeredBy(gateway)].sort()).toEqual([0, 1]);
  });

  it("forget a replica that stopped once ttlMs passes, and keep the peers' load across setUpstreams()", async () => {
    const { mock, a, b, held } = await heldOnRankOne();
    b.router.setUpstreams([{ url: mock.url, name: 'vllm', dataParallelSize: 2 }, { url: mock.url, name: 'other', dataParallelSize: 1 }]);
    expect(rankOf(b, 1).peerInflight).toBe(1);
    // Heartbeats keep the peer counted well past ttlMs while it runs.
    await sleep(500);
    expect(rankOf(b, 1).peerInflight).toBe(1);
    expect(await metricValue(b.registry, 'dp_router_peers')).toBe(1);
    // A replica that stops announces nothing more: its last counts go after ttlMs.
    await a.router.close();
    await waitFor(() => rankOf(b, 1).peerInflight === 0, 2000);
    expect(await metricValue(b.registry, 'dp_router_peers')).toBe(0);
    held.abort();
  });

  it("refuse a captured datagram replayed after the sender stopped (it would keep the stopped replica's load counted), and one replayed to a replica that never heard the sender, counting both", async () => {
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 1000 });
    started.push(mock);
    // An eavesdropper on the peers' network: A announces to it as to any replica.
    const tap = createSocket('udp4');
    const captured: Buffer[] = [];
    tap.on('message', (message) => captured.push(message));
    await new Promise<void>((resolve) => tap.bind(0, '127.0.0.1', resolve));
    started.push({ close: () => new Promise<void>((resolve) => tap.close(() => resolve())) });
    const ports = [await freeUdpPort(), await freeUdpPort(), await freeUdpPort()];
    const addresses = [...ports.map((port) => `127.0.0.1:${port}`), `127.0.0.1:${tap.address().port}`];
    const start = async (port: number, options: Partial<Options>) => {
      const gateway = await startGateway({
        upstreams: [{ url: mock.url, name: 'vllm', dataParallelSize: 2 }],
        peers: { listen: `127.0.0.1:${port}`, addresses, secret: SECRET, heartbeatMs: 50, ttlMs: 300 },
        logger: false,
        ...options,
      });
      started.push(gateway);
      return gateway;
    };
    const a = await start(ports[0], { hints: { trust: true } });
    const b = await start(ports[1], {});
    const held = await stream(a, 'a held prompt', 30, { 'x-data-parallel-rank': '1' });
    await waitFor(() => rankOf(b, 1).peerInflight === 1);
    // A datagram that carries the held request (a heartbeat carries every endpoint).
    await waitFor(() => captured.some((message) => carriesHeld(message)));
    const replay = captured.filter((message) => carriesHeld(message)).pop()!;
    await a.router.close();
    held.abort();
    await waitFor(() => rankOf(b, 1).peerInflight === 0, 2000);
    await sendDatagrams(ports[1], [replay, replay]);
    await sleep(100);
    expect(rankOf(b, 1).peerInflight).toBe(0);
    expect(await metricValue(b.registry, 'dp_router_peers')).toBe(0);
    const refused = async (gateway: TestGateway) =>
      (await metricValue(gateway.registry, 'dp_router_peer_datagrams_total', { outcome: 'replayed' })) + (await metricValue(gateway.registry, 'dp_router_peer_datagrams_total', { outcome: 'stale' }));
    expect(await refused(b)).toBe(2);
    // A replica started later never heard A: the datagram's signed time, past ttlMs, refuses it.
    const c = await start(ports[2], {});
    await sendDatagrams(ports[2], [replay]);
    await sleep(100);
    expect(rankOf(c, 1).peerInflight).toBe(0);
    expect(await metricValue(c.registry, 'dp_router_peer_datagrams_total', { outcome: 'stale' })).toBe(1);
  });

  it('announce a burst of requests in a few batches, at most one per announceMs (not one per request), and end exact', async () => {
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 2 });
    started.push(mock);
    const tap = createSocket('udp4');
    let heard = 0;
    tap.on('message', () => heard++);
    await new Promise<void>((resolve) => tap.bind(0, '127.0.0.1', resolve));
    started.push({ close: () => new Promise<void>((resolve) => tap.close(() => resolve())) });
    const ports = [await freeUdpPort(), await freeUdpPort()];
    const addresses = [...ports.map((port) => `127.0.0.1:${port}`), `127.0.0.1:${tap.address().port}`];
    const start = async (port: number) => {
      const gateway = await startGateway({
        upstreams: [{ url: mock.url, name: 'vllm', dataParallelSize: 2 }],
        peers: { listen: `127.0.0.1:${port}`, addresses, secret: SECRET, heartbeatMs: 2000, ttlMs: 6000, announceMs: 500 },
        logger: false,
      });
      started.push(gateway);
      return gateway;
    };
    const a = await start(ports[0]);
    const b = await start(ports[1]);
    await waitFor(() => heard >= 2);
    const before = heard;
    const began = performance.now();
    // 200 requests, 20 at a time: 400 changes of A's counts.
    for (let wave = 0; wave < 10; wave++) await Promise.all(Array.from({ length: 20 }, () => answeredBy(a)));
    const elapsed = performance.now() - began;
    const sent = heard - before;
    // One batch per announceMs at most, plus the heartbeats, plus one in flight at either end.
    expect(sent).toBeLessThanOrEqual(Math.ceil(elapsed / 500) + Math.ceil(elapsed / 2000) + 2);
    // Small changes wait for the heartbeat, which makes every count exact again.
    await waitFor(() => b.router.endpoints().every((endpoint) => endpoint.peerInflight === 0), 5000);
  });

  it('48.24: under a steady closed-loop load announce the mean in flight, which does not move: a few batches, not one per announceMs', async () => {
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 1 });
    started.push(mock);
    const tap = createSocket('udp4');
    const heard: Buffer[] = [];
    tap.on('message', (message) => heard.push(message));
    await new Promise<void>((resolve) => tap.bind(0, '127.0.0.1', resolve));
    started.push({ close: () => new Promise<void>((resolve) => tap.close(() => resolve())) });
    const port = await freeUdpPort();
    const announceMs = 100;
    const a = await startGateway({
      upstreams: [{ url: mock.url, name: 'vllm', dataParallelSize: 2 }],
      policy: 'round-robin',
      peers: { listen: `127.0.0.1:${port}`, addresses: [`127.0.0.1:${tap.address().port}`], secret: SECRET, heartbeatMs: 60_000, ttlMs: 180_000, announceMs },
      logger: false,
    });
    started.push(a);
    await waitFor(() => heard.length >= 1);
    // One request at a time, turn by turn on the two ranks: each rank's count goes 0, 1, 0
    // many times an interval, and is 0 or 1 at any instant; its mean over an interval stays.
    for (const end = performance.now() + 300; performance.now() < end; ) await answeredBy(a);
    const before = heard.length;
    const began = performance.now();
    for (const end = began + 2_500; performance.now() < end; ) await answeredBy(a);
    const intervals = (performance.now() - began) / announceMs;
    const sent = heard.length - before;
    // Announcing the count at the batch's instant sent a batch in most intervals.
    expect(sent).toBeLessThan(intervals / 4);
    // The load ends: the mean falls to 0 and is announced without waiting for the heartbeat.
    await waitFor(() => {
      const latest = new Map<string, number>();
      for (const message of heard) {
        const datagram = decodeDatagram(message, Buffer.from(SECRET));
        if (typeof datagram !== 'string') for (const record of datagram.records) latest.set(record.key, record.inflight);
      }
      return latest.size === 2 && [...latest.values()].every((inflight) => inflight === 0);
    }, 2_000);
  });

  it('announce the end of a request on an endpoint the replica has since removed', async () => {
    const { mock, a, b, held } = await heldOnRankOne();
    // A leaves the upstream (it stays in B's list): the request runs on, so its slot still counts.
    a.router.setUpstreams([{ url: mock.url, name: 'other', dataParallelSize: 1 }]);
    await sleep(200);
    expect(rankOf(b, 1).peerInflight).toBe(1);
    held.abort();
    await waitFor(() => rankOf(b, 1).peerInflight === 0);
    // A still runs and announces: B's count for the removed endpoint stays 0, not expired.
    await sleep(400);
    expect(rankOf(b, 1)).toMatchObject({ peerInflight: 0, peerBlocks: 0 });
  });

  it('find the replicas by DNS (a headless Service), and follow its changes', async () => {
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 1000 });
    started.push(mock);
    // Two replicas on two loopback addresses and one port, as pods behind a headless Service.
    const port = await freeUdpPort();
    const dns = await startDnsmasq([['127.0.0.2', 'gateways.test'], ['127.0.0.3', 'gateways.test']]);
    started.push(dns);
    const warnings: string[] = [];
    const start = async (host: string, options: Partial<Options>) => {
      const gateway = await startGateway({
        upstreams: [{ url: mock.url, name: 'vllm', dataParallelSize: 2 }],
        peers: { listen: `${host}:${port}`, dns: { name: 'gateways.test', port, intervalMs: 50, servers: [dns.server] }, secret: SECRET, heartbeatMs: 50, ttlMs: 300 },
        logger: { warn: (message) => warnings.push(message) },
        ...options,
      });
      started.push(gateway);
      return gateway;
    };
    const a = await start('127.0.0.2', { hints: { trust: true } });
    const b = await start('127.0.0.3', {});
    const held = await stream(a, 'a held prompt', 30, { 'x-data-parallel-rank': '1' });
    await waitFor(() => rankOf(b, 1).peerInflight === 1);
    expect(await metricValue(b.registry, 'dp_router_peers')).toBe(1);
    // B leaves the Service: A stops announcing to it, and B forgets A after ttlMs.
    await dns.setHosts([['127.0.0.2', 'gateways.test']]);
    await waitFor(() => rankOf(b, 1).peerInflight === 0, 3000);
    expect(await metricValue(b.registry, 'dp_router_peers')).toBe(0);
    held.abort();
    expect(warnings).toEqual([]);
  });
});

