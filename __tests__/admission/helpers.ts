import Redis from 'ioredis';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Closable } from '../helpers/lifecycle';

// A real redis-server moved to ../helpers/redis.ts, shared with the peers' tests.
export { startRedis, type TestRedis } from '../helpers/redis';

/** An ioredis client that gives up fast when Redis is gone (the store's own 250 ms deadline covers the rest), disconnected after the test. */
export function redisClient(url: string, started: Closable[]): Redis {
  const redis = new Redis(url, { maxRetriesPerRequest: 1, retryStrategy: () => 50 });
  redis.on('error', () => undefined);
  started.push({ close: () => void redis.disconnect() });
  return redis;
}

/** An upstream that records each request and holds its answer until the test lets it go. */
export interface HeldUpstream {
  readonly url: string;
  /** Requests arrived, in order, by the test's label header (`x-label`). */
  readonly arrived: string[];
  /** Headers of each arrival. */
  readonly headers: IncomingMessage['headers'][];
  /** Requests held now. */
  readonly held: number;
  /** The most held at once. */
  readonly peak: number;
  /** Answers the oldest held request. */
  releaseOne(): void;
  releaseAll(): void;
  close(): Promise<void>;
}

export async function startHeldUpstream(answer = '{"id":"x","object":"text_completion","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'): Promise<HeldUpstream> {
  const held: ServerResponse[] = [];
  const arrived: string[] = [];
  const headers: IncomingMessage['headers'][] = [];
  let peak = 0;
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      arrived.push(String(req.headers['x-label'] ?? ''));
      headers.push(req.headers);
      held.push(res);
      res.once('close', () => {
        const at = held.indexOf(res);
        if (at !== -1) held.splice(at, 1);
      });
      peak = Math.max(peak, held.length);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const send = (res: ServerResponse) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(answer);
  };
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    arrived,
    headers,
    get held() {
      return held.length;
    },
    get peak() {
      return peak;
    },
    releaseOne() {
      const res = held.shift();
      if (res) send(res);
    },
    releaseAll() {
      for (const res of held.splice(0)) send(res);
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
