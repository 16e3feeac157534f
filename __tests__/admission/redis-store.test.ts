import { describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { redisTokenStore, type Options, type TokenStore } from '../../lib';
import { startMockVllm } from '../../example-server/mock-vllm';
import { closedAfterEach, exchange, freePort, metricValue, startGateway, thrownOptionError, waitFor, type TestGateway } from '../helpers';
import { redisClient, startRedis } from './helpers';

const started = closedAfterEach();

const client = (url: string) => redisClient(url, started);

async function gateway(upstream: string, options: Partial<Options>): Promise<TestGateway> {
  const gw = await startGateway({ upstreams: [{ url: upstream }], logger: false, ...options });
  started.push(gw);
  return gw;
}

/** A real redis-server and a mock vLLM, stopped after the test. */
async function redisAndMock() {
  const redis = await startRedis();
  started.push({ close: () => redis.stop() });
  const mock = await startMockVllm({ dataParallelSize: 1 });
  started.push(mock);
  return { redis, mock };
}

/** A gateway with a trusted tenant header's budget in `store`, and the warnings it logs. */
async function warnedGateway(upstream: string, perMinute: number, store: TokenStore) {
  const warnings: string[] = [];
  const gw = await gateway(upstream, { logger: { warn: (message: string) => warnings.push(message) }, admission: { tenant: { header: 'x-tenant-id', trust: true }, tokens: { perMinute, store } } });
  return { gw, warnings };
}

// "hello world!" is 3 tokens to the mock, 8 generated: 11 per request.
const body = JSON.stringify({ model: 'mock-model', prompt: 'hello world!', max_tokens: 8 });
const send = (gw: TestGateway, tenant: string) => exchange(gw.url, { body, headers: { 'x-tenant-id': tenant } });

describe('redisTokenStore', () => {
  it('shares each tenant’s budget between two routers, atomically, with keys that expire', async () => {
    const { redis, mock } = await redisAndMock();
    const admission = (prefix: string) => ({ tenant: { header: 'x-tenant-id', trust: true }, tokens: { perMinute: 30, store: redisTokenStore(client(redis.url), { prefix }) } });
    const one = await gateway(mock.url, { admission: admission('t:') });
    const two = await gateway(mock.url, { admission: admission('t:') });
    expect((await send(one, 'a')).status).toBe(200);
    expect((await send(two, 'a')).status).toBe(200);
    await waitFor(async () => Number(await client(redis.url).call('GET', `{t:a}:${Math.floor(Date.now() / 60_000)}`)) === 22);
    expect((await send(one, 'a')).status).toBe(200);
    await waitFor(async () => (await send(two, 'a')).status === 429);
    const refused = await send(one, 'a');
    expect(refused.status).toBe(429);
    expect(JSON.parse(refused.body).error.type).toBe('RateLimitError');
    expect(Number(refused.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    // Another tenant has its own budget.
    expect((await send(two, 'b')).status).toBe(200);
    const ttl = Number(await client(redis.url).call('PTTL', `{t:a}:${Math.floor(Date.now() / 60_000)}`));
    expect(ttl).toBeGreaterThan(60_000);
    expect(ttl).toBeLessThanOrEqual(125_000);
  });

  it('fails open when Redis dies mid-run: traffic goes on, each failure counted, the outage logged once', async () => {
    const { redis, mock } = await redisAndMock();
    const { gw, warnings } = await warnedGateway(mock.url, 1_000, redisTokenStore(client(redis.url)));
    expect((await send(gw, 'a')).status).toBe(200);
    await redis.stop();
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push(await send(gw, 'a'));
    expect(answers.map((answer) => answer.status)).toEqual([200, 200, 200, 200]);
    await waitFor(async () => (await metricValue(gw.registry, 'dp_router_token_store_errors_total')) >= 4);
    expect(warnings.filter((line) => line.includes('token store failed'))).toHaveLength(1);
    // Back on the same port: one line says so, and budgets count again.
    const again = await startRedis(redis.port);
    started.push({ close: () => again.stop() });
    await waitFor(async () => (await send(gw, 'a')).status === 200 && warnings.some((line) => line.includes('answers again;')), 10_000);
    expect(warnings.filter((line) => line.includes('answers again;'))).toHaveLength(1);
  });

  it('takes a count that is not a number (another writer on a shared Redis) as a store failure: fail open, counted, logged once, and the key expires', async () => {
    const { redis, mock } = await redisAndMock();
    const { gw, warnings } = await warnedGateway(mock.url, 30, redisTokenStore(client(redis.url), { prefix: 'w:' }));
    const key = `{w:a}:${Math.floor(Date.now() / 60_000)}`;
    await client(redis.url).call('SET', key, 'not-a-number');
    const answers = [];
    for (let i = 0; i < 3; i++) answers.push(await send(gw, 'a'));
    expect(answers.map((answer) => [answer.status, answer.headers['retry-after']])).toEqual([
      [200, undefined],
      [200, undefined],
      [200, undefined],
    ]);
    await waitFor(async () => (await metricValue(gw.registry, 'dp_router_token_store_errors_total')) >= 3);
    expect(warnings.filter((line) => line.includes('token store failed'))).toHaveLength(1);
    // The foreign value is left as it is, but it goes with its window instead of staying for ever.
    expect(await client(redis.url).call('GET', key)).toBe('not-a-number');
    const ttl = Number(await client(redis.url).call('PTTL', key));
    expect(ttl).toBeGreaterThan(60_000);
    expect(ttl).toBeLessThanOrEqual(125_000);
    // Another tenant's budget still counts.
    expect((await send(gw, 'b')).status).toBe(200);
    expect((await send(gw, 'b')).status).toBe(200);
    await waitFor(async () => (await send(gw, 'b')).status === 429);
    const refused = await send(gw, 'b');
    expect(refused.headers['retry-after']).toMatch(/^[1-9][0-9]*$/);
  });
});

/**
 * A real one-node Redis Cluster (every slot on it): a script whose keys hash to two slots fails there with CROSSSLOT.
 * Its bus port is chosen too: Redis's default, the port + 10000, lands in the kernel's ephemeral range,
 * where any connect() may hold it (CI on Node 22: "bind: Address already in use", the server exited).
 */
async function startClusterRedis() {
  const folder = mkdtempSync(join(tmpdir(), 'dp-router-cluster-'));
  const cluster = ['--cluster-enabled', 'yes', '--cluster-config-file', join(folder, 'nodes.conf'), '--cluster-port', String(await freePort())];
  const redis = await startRedis(undefined, cluster);
  started.push({ close: async () => (await redis.stop(), rmSync(folder, { recursive: true, force: true })) });
  await client(redis.url).call('CLUSTER', 'ADDSLOTSRANGE', '0', '16383');
  await waitFor(async () => String(await client(redis.url).call('CLUSTER', 'INFO')).includes('cluster_state:ok'), 10_000);
  return redis;
}

describe('redisTokenStore on Redis Cluster', () => {
  it('48.18: a tenant’s two window keys share one hash slot (CLUSTER KEYSLOT), whatever the tenant', async () => {
    const redis = await startClusterRedis();
    const window = Math.floor(Date.now() / 60_000);
    const keys: string[] = [];
    const recorder = { call: async (...args: (string | number)[]) => (args[0] === 'EVALSHA' ? (keys.push(String(args[3]), String(args[4])), [1]) : undefined) };
    const store = redisTokenStore(recorder);
    for (const tenant of ['a', '', 'team}x', '{b}', 'ü']) await store.take!(tenant, window, 1, 10, 0.5);
    expect(keys.slice(0, 2)).toEqual([`{dp_router:tokens:a}:${window}`, `{dp_router:tokens:a}:${window - 1}`]);
    for (let at = 0; at < keys.length; at += 2) {
      const slots = await Promise.all([keys[at], keys[at + 1]].map((key) => client(redis.url).call('CLUSTER', 'KEYSLOT', key)));
      expect(slots[0]).toBe(slots[1]);
    }
  });

  it('48.18: enforces budgets on Redis Cluster: the reservation script’s keys are not cross-slot', async () => {
    const redis = await startClusterRedis();
    const mock = await startMockVllm({ dataParallelSize: 1 });
    started.push(mock);
    const { gw, warnings } = await warnedGateway(mock.url, 30, redisTokenStore(client(redis.url)));
    expect((await send(gw, 'a')).status).toBe(200);
    expect((await send(gw, 'a')).status).toBe(200);
    await waitFor(async () => (await send(gw, 'a')).status === 429);
    expect(await metricValue(gw.registry, 'dp_router_token_store_errors_total')).toBe(0);
    expect(warnings).toEqual([]);
  });

  it('48.18: refuses a prefix that would leave the hash tag empty', () => {
    expect(thrownOptionError(() => redisTokenStore(client('redis://127.0.0.1:1'), { prefix: '' })).message).toMatch(/redisTokenStore\.prefix.*non-empty/);
    expect(thrownOptionError(() => redisTokenStore(client('redis://127.0.0.1:1'), { prefix: '}x' })).message).toMatch(/redisTokenStore\.prefix/);
  });
});

describe('redisTokenStore when Redis is down or refuses us', () => {
  it('48.13: with Redis gone, requests stop asking it after the first failures (a breaker); a probe finds it back and budgets count again', async () => {
    const redis = await startRedis(undefined, ['--requirepass', 'pw']);
    started.push({ close: () => redis.stop() });
    const mock = await startMockVllm({ dataParallelSize: 1 });
    started.push(mock);
    const url = `redis://:pw@127.0.0.1:${redis.port}`;
    const real = client(url);
    let calls = 0;
    const counted = { call: (command: string, ...args: (string | number)[]) => (calls++, real.call(command, ...args)) };
    const { gw, warnings } = await warnedGateway(mock.url, 100_000, redisTokenStore(counted, { prefix: 'o:' }));
    expect((await send(gw, 'a')).status).toBe(200);
    await redis.stop();
    calls = 0;
    const statuses = [];
    const since = performance.now();
    for (let i = 0; i < 10; i++) statuses.push((await send(gw, 'a')).status);
    const seconds = (performance.now() - since) / 1000;
    expect(statuses).toEqual(Array(10).fill(200));
    // Without a breaker each request asked twice (its reservation, then its settlement), each
    // waiting up to the store's timeout: 20 calls. With it: the two failures that open it, and
    // a probe a second at most.
    expect(calls).toBeLessThanOrEqual(2 + Math.ceil(seconds));
    expect(calls).toBeLessThan(10);
    // Every request that went on unchecked is counted.
    expect(await metricValue(gw.registry, 'dp_router_token_store_errors_total')).toBeGreaterThanOrEqual(10);
    expect(warnings.filter((line) => line.includes('token store failed'))).toHaveLength(1);
    const again = await startRedis(redis.port, ['--requirepass', 'pw']);
    started.push({ close: () => again.stop() });
    await waitFor(async () => (await send(gw, 'a')).status === 200 && warnings.some((line) => line.includes('answers again;')), 10_000);
    // Reserved and settled in Redis again.
    await waitFor(async () => Number(await client(url).call('GET', `{o:a}:${Math.floor(Date.now() / 60_000)}`)) > 0);
  });

  it('48.13: a wrong password is logged at error level at start, before any request', async () => {
    const redis = await startRedis(undefined, ['--requirepass', 'pw']);
    started.push({ close: () => redis.stop() });
    const mock = await startMockVllm({ dataParallelSize: 1 });
    started.push(mock);
    const warnings: string[] = [];
    const errors: string[] = [];
    const logger = { warn: (message: string) => warnings.push(message), error: (_fields: object, message: string) => errors.push(message) };
    await gateway(mock.url, { logger, admission: { tenant: { header: 'x-tenant-id', trust: true }, tokens: { perMinute: 1_000, store: redisTokenStore(client(`redis://:wrong@127.0.0.1:${redis.port}`)) } } });
    await waitFor(() => errors.length > 0);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/token store failed \(WRONGPASS.*refuses the credentials/);
    expect(warnings.filter((line) => line.includes('token store'))).toEqual([]);
  });
});
