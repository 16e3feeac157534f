import { describe, expect, it } from '@jest/globals';
import { createClient } from 'redis';
import { startMockVllm } from '../../example-server/mock-vllm';
import { redisTokenStore } from '../../lib';
import { closedAfterEach, exchange, metricValue, startGateway, startRedis, waitFor, type TestRedis } from '../helpers';
import { answeredBy, rankOf, stream } from './helpers';

// node-redis (the `redis` package) is the other client the docs name for `peers.redis` and
// `redisTokenStore`: each is run here against a real redis-server, as ioredis is elsewhere.

const started = closedAfterEach();
const SECRET = 'the replicas share this secret';

/** The user's own connected node-redis client, closed after the test. */
async function nodeRedis(redis: TestRedis) {
  const client = createClient({ url: redis.url, socket: { reconnectStrategy: 50 } });
  client.on('error', () => undefined);
  await client.connect();
  started.push({ close: () => void (client.isOpen ? client.destroy() : undefined) });
  return client;
}

async function server(): Promise<TestRedis> {
  const redis = await startRedis();
  started.push({ close: () => redis.stop() });
  return redis;
}

describe('node-redis clients', () => {
  it('48.21: peers over node-redis pub/sub share each replica’s requests and close only their own connection', async () => {
    const redis = await server();
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 1000 });
    started.push(mock);
    const [own, ownOfB, watcher] = await Promise.all([nodeRedis(redis), nodeRedis(redis), nodeRedis(redis)]);
    const warnings: string[] = [];
    const replica = async (client: typeof own, trust: boolean) => {
      const gateway = await startGateway({
        upstreams: [{ url: mock.url, name: 'vllm', dataParallelSize: 2 }],
        peers: { redis: client, secret: SECRET, heartbeatMs: 50, ttlMs: 300 },
        hints: { trust },
        logger: { warn: (message) => warnings.push(message) },
      });
      started.push(gateway);
      return gateway;
    };
    const a = await replica(own, true);
    const b = await replica(ownOfB, false);
    await waitFor(async () => Number((await watcher.sendCommand(['PUBSUB', 'NUMSUB', 'dp-router:peers']) as [string, number])[1]) === 2);
    const held = await stream(a, 'a held prompt', 30, { 'x-data-parallel-rank': '1' });
    expect(held.status).toBe(200);
    await waitFor(() => rankOf(b, 1).peerInflight === 1, 5000, () => `b sees ${JSON.stringify(b.router.endpoints())}`);
    expect(await metricValue(b.registry, 'dp_router_peers')).toBe(1);
    expect([await answeredBy(b), await answeredBy(b)]).toEqual([0, 0]);
    // A stops: its subscriber goes, the user's client stays open, and B forgets A.
    await a.router.close();
    expect(await own.ping()).toBe('PONG');
    await waitFor(async () => Number((await watcher.sendCommand(['PUBSUB', 'NUMSUB', 'dp-router:peers']) as [string, number])[1]) === 1);
    await waitFor(() => rankOf(b, 1).peerInflight === 0, 2000);
    held.abort();
    expect(warnings).toEqual([]);
  });

  it('48.21: redisTokenStore over node-redis reserves, settles and refuses as over ioredis, and loads its scripts again after SCRIPT FLUSH', async () => {
    const redis = await server();
    const mock = await startMockVllm({ dataParallelSize: 1 });
    started.push(mock);
    const client = await nodeRedis(redis);
    const gw = await startGateway({ upstreams: [{ url: mock.url }], logger: false, admission: { tenant: { header: 'x-tenant-id', trust: true }, tokens: { perMinute: 30, store: redisTokenStore(client, { prefix: 'n:' }) } } });
    started.push(gw);
    // "hello world!" is 3 tokens to the mock, 8 generated: 11 per request.
    const body = JSON.stringify({ model: 'mock-model', prompt: 'hello world!', max_tokens: 8 });
    const send = () => exchange(gw.url, { body, headers: { 'x-tenant-id': 'a' } });
    expect((await send()).status).toBe(200);
    const key = () => `{n:a}:${Math.floor(Date.now() / 60_000)}`;
    await waitFor(async () => Number(await client.get(key())) === 11);
    await client.scriptFlush();
    expect((await send()).status).toBe(200);
    await waitFor(async () => Number(await client.get(key())) === 22);
    expect((await send()).status).toBe(200);
    await waitFor(async () => (await send()).status === 429);
    expect(await metricValue(gw.registry, 'dp_router_token_store_errors_total')).toBe(0);
  });
});
