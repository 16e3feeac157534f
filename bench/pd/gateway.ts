/**
 * bench:pd's gateway: `pd` splits each request between the prefill and decode servers, `whole`
 * sends it whole to the decode server, through the same router code. For `pd`, it stamps when
 * each prefill answer was read and when its decode leg was dispatched (diagnostics_channel's
 * `http.client.request.start`), and serves the gaps at `GET /bench/gaps` (wall and CPU). Prints `READY <port>`.
 */
import { subscribe } from 'node:diagnostics_channel';
import { createServer, type ClientRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import { dpRouter } from '../../lib';
import { PrefillClient } from '../../lib/disaggregation/prefill-client';

const [mode, prefillUrl, decodeUrl] = process.argv.slice(2);
/** When each prefill answer was read: wall clock, and this process's CPU time (not inflated by time descheduled). */
const answered = new Map<string, { wall: number; cpu: NodeJS.CpuUsage }>();
/** Per decode leg: [wall ms, CPU ms] from its prefill answer. */
const gaps: Array<[number, number]> = [];

if (mode === 'pd') {
  // Bench instrumentation only: the time each prefill answer was read, by request id.
  const post = PrefillClient.prototype.post;
  PrefillClient.prototype.post = function timed(this: PrefillClient, ...args: Parameters<PrefillClient['post']>) {
    const call = post.apply(this, args);
    const id = String(args[1]['x-request-id']);
    void call.result.then(() => answered.set(id, { wall: performance.now(), cpu: process.cpuUsage() }));
    return call;
  };
  // The decode leg is the first request with that id to start after its prefill answered.
  subscribe('http.client.request.start', (message) => {
    const id = String((message as { request: ClientRequest }).request.getHeader('x-request-id'));
    const at = answered.get(id);
    if (at === undefined) return;
    answered.delete(id);
    const cpu = process.cpuUsage(at.cpu);
    gaps.push([performance.now() - at.wall, (cpu.user + cpu.system) / 1000]);
  });
}

const router = dpRouter(
  mode === 'pd'
    ? {
        upstreams: [
          { url: prefillUrl, dataParallelSize: 4, role: 'prefill' },
          { url: decodeUrl, dataParallelSize: 4, role: 'decode' },
        ],
        disaggregation: { connector: 'nixl' },
        metrics: { registry: new Registry() },
      }
    : { upstreams: [{ url: decodeUrl, dataParallelSize: 4 }], metrics: { registry: new Registry() } },
);
const server = createServer((req, res) => {
  if (req.url === '/bench/gaps') {
    const body = JSON.stringify(gaps.splice(0));
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
    return;
  }
  router(req, res, () => {
    res.writeHead(500);
    res.end();
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => process.stdout.write(`READY ${(server.address() as AddressInfo).port}\n`));
process.on('SIGTERM', () => process.exit(0));
process.stdout.on('error', () => undefined);
