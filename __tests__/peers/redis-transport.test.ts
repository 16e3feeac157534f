import { describe, expect, it } from '@jest/globals';
import Redis from 'ioredis';
import { startMockVllm } from '../../example-server/mock-vllm';
import { dpRouter, OptionError, type Options } from '../../lib';
import { encodeDatagrams } from '../../lib/peers/peer-datagram';
import { closedAfterEach, metricValue, startGateway, startRedis, waitFor, type TestRedis } from '../helpers';
import { answeredBy, rankOf, stream } from './helpers';

const started = closedAfterEach();
const SECRET = 'the replicas share this secret';

/** The user's own ioredis client: the router must publish with it and never close it. */
function client(redis: TestRedis): Redis {
  const connection = new Redis(redis.url, { maxRetriesPerRequest: 1, retryStrategy: () => 50 });
  connection.on('error', () => undefined);
  started.push({ close: () => void connection.disconnect() });
  return connection;
}

/** Connections the Redis server holds now (`CLIENT LIST`), by name of the last command. */
async function connections(redis: Redis): Promise<string[]> {
  const list = (await redis.call('CLIENT', 'LIST')) as string;
  return list.trim().split('\n').map((line) => /cmd=(\S+)/.exec(line)![1]);
}

async function replica(url: string, redis: Redis, options: Partial<Options> = {}, warnings: string[] = []) {
  const gateway = await startGateway({
    upstreams: [{ url, name: 'vllm', dataParallelSize: 2 }],
    peers: { redis, secret: SECRET, heartbeatMs: 50, ttlMs: 300 },
    logger: { warn: (message) => warnings.push(message) },
    ...options,
  });
  started.push(gateway);
  return gateway;
}

describe('peers over Redis pub/sub', () => {
  it("share each replica's requests through a real redis-server, forget a stopped replica after ttlMs, and close only their own connection", async () => {
    const server = await startRedis();
    started.push({ close: () => server.stop() });
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 1000 });
    started.push(mock);
    const own = client(server);
    const ownOfB = client(server);
    const watcher = client(server);
    await Promise.all([own.ping(), ownOfB.ping()]);
    const before = (await connections(watcher)).length;
    const warnings: string[] = [];
    const a = await replica(mock.url, own, { hints: { trust: true } }, warnings);
    const b = await replica(mock.url, ownOfB, {}, warnings);
    // Each router subscribes on a connection of its own (a subscribed connection cannot publish).
    await waitFor(async () => (await connections(watcher)).filter((cmd) => cmd === 'subscribe').length === 2);
    const held = await stream(a, 'a held prompt', 30, { 'x-data-parallel-rank': '1' });
    expect(held.status).toBe(200);
    await waitFor(() => rankOf(b, 1).peerInflight === 1, 5000, () => `b sees ${JSON.stringify(b.router.endpoints())}`);
    expect(rankOf(b, 0).peerInflight).toBe(0);
    expect(await metricValue(b.registry, 'dp_router_peers')).toBe(1);
    expect(await metricValue(b.registry, 'dp_router_peer_datagrams_total', { outcome: 'accepted' })).toBeGreaterThan(0);
    // B's own counts are level: the peer's request on rank 1 sends B's to rank 0.
    expect([await answeredBy(b), await answeredBy(b)]).toEqual([0, 0]);

    // A stops: its subscriber connection goes, the user's client stays open, and B forgets A.
    await a.router.close();
    expect(await own.ping()).toBe('PONG');
    await waitFor(async () => (await connections(watcher)).filter((cmd) => cmd === 'subscribe').length === 1);
    await waitFor(() => rankOf(b, 1).peerInflight === 0, 2000);
    expect(await metricValue(b.registry, 'dp_router_peers')).toBe(0);
    held.abort();
    await b.router.close();
    await waitFor(async () => (await connections(watcher)).length === before);
    expect(warnings).toEqual([]);
  });

  it('drop what another writer publishes on the channel without the secret, counting it', async () => {
    const server = await startRedis();
    started.push({ close: () => server.stop() });
    const mock = await startMockVllm({ dataParallelSize: 2 });
    started.push(mock);
    const warnings: string[] = [];
    const b = await replica(mock.url, client(server), {}, warnings);
    const other = client(server);
    await waitFor(async () => Number(((await other.call('PUBSUB', 'NUMSUB', 'dp-router:peers')) as [string, number])[1]) === 1);
    const forged = encodeDatagrams(99, 1, Date.now(), [{ key: 'vllm#0', inflight: 1000, blocks: 1e6 }], Buffer.from('not the replicas secret at all'));
    await other.publish('dp-router:peers', forged[0]);
    await other.publish('dp-router:peers', 'hello');
    await waitFor(async () => (await metricValue(b.registry, 'dp_router_peer_datagrams_total', { outcome: 'bad_tag' })) === 1);
    await waitFor(async () => (await metricValue(b.registry, 'dp_router_peer_datagrams_total', { outcome: 'malformed' })) === 1);
    expect(rankOf(b, 0).peerInflight).toBe(0);
    expect(warnings).toHaveLength(2);
    // Redis delivers B's own heartbeats back to it: skipped before their tag is checked, and not counted.
    expect(await metricValue(b.registry, 'dp_router_peer_datagrams_total', { outcome: 'accepted' })).toBe(0);
  });

  it('refuse a value that is no Redis client, and UDP options beside `redis`', () => {
    const mock = 'http://127.0.0.1:9';
    const attempt = (peers: unknown) => () => dpRouter({ upstreams: [{ url: mock }], peers: peers as never });
    expect(attempt({ redis: 'redis://127.0.0.1:6379', secret: SECRET })).toThrow(OptionError);
    expect(attempt({ redis: 'redis://127.0.0.1:6379', secret: SECRET })).toThrow(/peers\.redis.*must be an ioredis or node-redis client/);
    const lazy = new Redis({ lazyConnect: true });
    expect(attempt({ redis: lazy, listen: '127.0.0.1:7946', secret: SECRET })).toThrow(/peers\.listen.*is an option of the UDP transport/);
    expect(attempt({ redis: lazy, channel: '', secret: SECRET })).toThrow(/peers\.channel.*non-empty string/);
    expect(attempt({ redis: lazy, secret: 'short' })).toThrow(/peers\.secret/);
    lazy.disconnect();
  });
});
