import Redis from 'ioredis';
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { freePort } from '../helpers/prometheus';
import type { Closable } from '../helpers/lifecycle';
import { waitFor } from '../helpers/wait';

/** A real redis-server on a free loopback port, without persistence; `stop()` kills it by PID. */
export interface TestRedis {
  readonly port: number;
  readonly url: string;
  stop(): Promise<void>;
}

export async function startRedis(port?: number): Promise<TestRedis> {
  const chosen = port ?? (await freePort());
  const child: ChildProcess = spawn('redis-server', ['--port', String(chosen), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  let killed = false;
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  await waitFor(() => output.includes('Ready to accept connections') || child.exitCode !== null, 5000, () => `redis-server did not start: ${output}`);
  if (child.exitCode !== null) throw new Error(`redis-server exited: ${output}`);
  return {
    port: chosen,
    url: `redis://127.0.0.1:${chosen}`,
    stop: async () => {
      if (!killed) {
        killed = true;
        process.kill(child.pid!, 'SIGKILL');
      }
      await exited;
    },
  };
}

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
