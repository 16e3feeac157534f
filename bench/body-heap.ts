/**
 * Heap held per request in flight for a hostile 16 MiB body, with the router reading bodies
 * (prefix-aware): the upstream holds every request open, so whatever the router keeps after
 * its decision stays reachable until the responses end.
 *
 *   node --expose-gc --import tsx bench/body-heap.ts [--requests 8] [--shape junk|messages]
 *
 * `junk` puts `[],[],…` in a member routing never reads; `messages` fills `messages`, which
 * prefix-aware must read and decode, with some 54,000 messages whose one member is a 300-character
 * `name`: about 107,000 values, under the 262,144 past which a prompt is not decoded at all, and
 * no prompt text (which would be kept for a retry's pick). `DP_ROUTER_LIB=/path/to/lib` measures
 * another build of lib/.
 */
import express from 'express';
import { createServer, request, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { Registry } from 'prom-client';

const argument = (name: string, fallback: string) => {
  const at = process.argv.indexOf(`--${name}`);
  return at === -1 ? fallback : process.argv[at + 1];
};
const requests = Number(argument('requests', '8'));
const shape = argument('shape', 'junk');
const SIZE = 16 * 1024 * 1024 - 64;

function hostileBody(): Buffer {
  const head = shape === 'messages' ? '{"model":"m","messages":[' : '{"model":"m","prompt":"hello","junk":[';
  const item = shape === 'messages' ? `{"name":"${'x'.repeat(300)}"}` : '[]';
  const items = Math.floor((SIZE - head.length - 2) / (item.length + 1));
  return Buffer.from(`${head}${`${item},`.repeat(items - 1)}${item}]}`);
}

const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('run with node --expose-gc');
const heap = () => {
  gc();
  gc();
  const usage = process.memoryUsage();
  return { heap: usage.heapUsed, external: usage.arrayBuffers };
};

async function main(): Promise<void> {
  const lib = process.env.DP_ROUTER_LIB ?? path.resolve(__dirname, '..', 'lib');
  const { dpRouter } = (await import(lib)) as typeof import('../lib');
  const held: ServerResponse[] = [];
  let seen = 0;
  const upstream = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      seen++;
      held.push(res);
    });
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  const router = dpRouter({ upstreams: [{ url: upstreamUrl, dataParallelSize: 2 }], policy: 'prefix-aware', metrics: { registry: new Registry() }, logger: false });
  const app = express();
  app.use(router);
  const gateway = createServer(app);
  await new Promise<void>((resolve) => gateway.listen(0, '127.0.0.1', resolve));
  const port = (gateway.address() as AddressInfo).port;

  const body = hostileBody();
  const before = heap();
  const answers: Array<Promise<number>> = [];
  for (let index = 0; index < requests; index++) {
    answers.push(
      new Promise((resolve) => {
        const outgoing = request({ host: '127.0.0.1', port, path: '/v1/chat/completions', method: 'POST', headers: { 'content-type': 'application/json' } }, (response) => {
          response.resume();
          response.on('end', () => resolve(response.statusCode ?? 0));
        });
        outgoing.on('error', () => resolve(0));
        outgoing.end(body);
      }),
    );
  }
  const deadline = Date.now() + 300_000;
  while (seen < requests && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50));
  const after = heap();
  const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(1);
  console.log(
    `shape=${shape} body=${mib(body.length)} MiB in flight=${seen}/${requests}: heap held per request ${mib((after.heap - before.heap) / requests)} MiB, ` +
      `buffers per request ${mib((after.external - before.external) / requests)} MiB`,
  );
  for (const res of held) res.end('{}');
  await Promise.all(answers);
  gateway.closeAllConnections();
  gateway.close();
  upstream.closeAllConnections();
  upstream.close();
  await router.close();
}

void main();
