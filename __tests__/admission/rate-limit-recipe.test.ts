import { describe, expect, it } from '@jest/globals';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import Redis from 'ioredis';
import { RedisStore, type RedisReply } from 'rate-limit-redis';
import { Registry } from 'prom-client';
import { dpRouter } from '../../lib';
import { startMockVllm } from '../../example-server/mock-vllm';
import { closedAfterEach, exchange, serve } from '../helpers';
import { startRedis } from './helpers';

const started = closedAfterEach();

/**
 * The recipe of docs/operating.md ("Requests per minute"): requests per key are
 * express-rate-limit's job, mounted in front of the router, with rate-limit-redis so that
 * gateway replicas share the count. The router keeps to tokens and capacity.
 */
async function replica(upstream: string, redisUrl: string) {
  const redis = new Redis(redisUrl);
  started.push({ close: () => void redis.disconnect() });
  const router = dpRouter({ upstreams: [{ url: upstream }], metrics: { registry: new Registry() }, logger: false });
  started.push(router);
  const app = express();
  app.use(
    rateLimit({
      windowMs: 60_000,
      limit: 2,
      standardHeaders: 'draft-8',
      legacyHeaders: false,
      // The tenant key the router's admission uses too; a request without one is limited by address.
      keyGenerator: (req) => String(req.headers['x-tenant-id'] ?? req.ip),
      validate: { keyGeneratorIpFallback: false },
      store: new RedisStore({ prefix: 'rl:', sendCommand: (command: string, ...args: string[]) => redis.call(command, ...args) as Promise<RedisReply> }),
      // The same error shape as vLLM's and the router's own 429.
      handler: (_req, res, _next, options) => {
        res.status(options.statusCode).json({ error: { message: 'Too many requests; retry later.', type: 'RateLimitError', param: null, code: options.statusCode } });
      },
    }),
  );
  app.use(router);
  const server = await serve(app);
  started.push(server);
  return server.url;
}

describe('express-rate-limit in front of the router', () => {
  it('limits requests per tenant across two gateway replicas sharing Redis, answering in the vLLM shape', async () => {
    const redis = await startRedis();
    started.push({ close: () => redis.stop() });
    const mock = await startMockVllm({ dataParallelSize: 2 });
    started.push(mock);
    const [one, two] = await Promise.all([replica(mock.url, redis.url), replica(mock.url, redis.url)]);
    const as = (tenant: string) => ({ headers: { 'x-tenant-id': tenant } });
    expect((await exchange(one, as('a'))).status).toBe(200);
    expect((await exchange(two, as('a'))).status).toBe(200);
    const limited = await exchange(one, as('a'));
    expect(limited.status).toBe(429);
    expect(JSON.parse(limited.body)).toEqual({ error: { message: expect.any(String), type: 'RateLimitError', param: null, code: 429 } });
    expect(limited.headers['retry-after']).toMatch(/^[1-9][0-9]*$/);
    expect((await exchange(two, as('b'))).status).toBe(200);
  });
});
