import express from 'express';
import { createServer, request as httpRequest, Agent, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import { dpRouter, type AdmissionOptions } from '../../lib';
import { startMockVllm } from '../../example-server/mock-vllm';
import { quantileSorted } from '../lib/stats';

/** One tenant's offered load: requests per second, Poisson arrivals. */
export interface Tenant {
  readonly name: string;
  readonly rate: number;
}

/** What one tenant got in a run. */
export interface TenantResult {
  readonly name: string;
  readonly sent: number;
  readonly completed: number;
  /** Time to first token (first SSE event), ms, of the requests completed. */
  readonly p50: number;
  readonly p99: number;
}

/** The fleet of the bench: `ranks` engines, each running `seqs` requests at once, `tokens` tokens at `decodeMs` each. */
export interface Fleet {
  readonly ranks: number;
  readonly seqs: number;
  readonly tokens: number;
  readonly decodeMs: number;
}

/** Requests per second the fleet completes when full. */
export function capacity(fleet: Fleet): number {
  return (fleet.ranks * fleet.seqs * 1000) / (fleet.tokens * fleet.decodeMs);
}

/**
 * Runs the tenants' open-loop load for `seconds` against a gateway over the mock (with
 * `admission`, or without: every request goes on to the engines, which queue FIFO past
 * `seqs`), and reports each tenant's TTFT and completions within the run.
 */
export async function runLoad(fleet: Fleet, tenants: readonly Tenant[], seconds: number, admission: AdmissionOptions | undefined, seed = 1): Promise<TenantResult[]> {
  const mock = await startMockVllm({ dataParallelSize: fleet.ranks, maxNumSeqs: fleet.seqs, decodeMsPerToken: fleet.decodeMs });
  const router = dpRouter({ upstreams: [{ url: mock.url, dataParallelSize: fleet.ranks }], metrics: { registry: new Registry() }, logger: false, ...(admission && { admission }) });
  const app = express();
  app.use(router);
  const server: Server = createServer(app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const agent = new Agent({ keepAlive: true, maxSockets: Infinity });
  const body = JSON.stringify({ model: 'mock-model', prompt: 'hello', max_tokens: fleet.tokens, stream: true });
  let random = seed;
  const uniform = () => ((random = (random * 1103515245 + 12345) % 2147483648) + 1) / 2147483649;
  const endAt = performance.now() + seconds * 1000;
  const results = new Map(tenants.map((tenant) => [tenant.name, { sent: 0, ttft: [] as number[], completed: 0 }]));
  const pending: Promise<void>[] = [];

  const send = (tenant: string) => {
    const record = results.get(tenant)!;
    record.sent++;
    const start = performance.now();
    pending.push(
      new Promise<void>((resolve) => {
        const outgoing = httpRequest(`${url}/v1/completions`, { method: 'POST', agent, headers: { 'content-type': 'application/json', 'x-tenant-id': tenant } });
        outgoing.on('response', (response) => {
          let first = true;
          response.on('data', () => {
            if (first && response.statusCode === 200) record.ttft.push(performance.now() - start);
            first = false;
          });
          response.on('end', () => {
            if (response.statusCode === 200 && performance.now() <= endAt) record.completed++;
            resolve();
          });
          response.on('error', () => resolve());
        });
        outgoing.on('error', () => resolve());
        outgoing.end(body);
      }),
    );
  };
  const arrivals = tenants.map(
    (tenant) =>
      new Promise<void>((resolve) => {
        const next = () => {
          if (performance.now() >= endAt) return resolve();
          send(tenant.name);
          setTimeout(next, (-Math.log(uniform()) * 1000) / tenant.rate);
        };
        setTimeout(next, (-Math.log(uniform()) * 1000) / tenant.rate);
      }),
  );
  await Promise.all(arrivals);
  // What is still queued when the arrivals stop does not count as served within the run.
  await Promise.race([Promise.all(pending), new Promise((resolve) => setTimeout(resolve, 5000))]);
  agent.destroy();
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  await router.close();
  await mock.close();
  return tenants.map((tenant) => {
    const record = results.get(tenant.name)!;
    const sorted = Float64Array.from(record.ttft).sort();
    return { name: tenant.name, sent: record.sent, completed: record.completed, p50: quantileSorted(sorted, 0.5), p99: quantileSorted(sorted, 0.99) };
  });
}

/**
 * Jain's index over each tenant's throughput normalised by its max-min fair share of what the
 * fleet delivered in the run (a tenant asking less than an equal share is owed all it asks):
 * 1 when every tenant gets its fair share.
 */
export function jainIndex(results: readonly TenantResult[], tenants: readonly Tenant[], seconds: number): number {
  const demands = tenants.map((tenant) => tenant.rate);
  const fleetRate = results.reduce((sum, result) => sum + result.completed, 0) / seconds;
  const shares = maxMinShares(demands, fleetRate);
  const x = results.map((result, index) => result.completed / seconds / shares[index]);
  const sum = x.reduce((a, b) => a + b, 0);
  return (sum * sum) / (x.length * x.reduce((a, b) => a + b * b, 0));
}

function maxMinShares(demands: readonly number[], total: number): number[] {
  const shares = demands.map(() => 0);
  let left = total;
  let open = demands.map((_, index) => index);
  while (open.length > 0 && left > 1e-9) {
    const each = left / open.length;
    const satisfied = open.filter((index) => demands[index] - shares[index] <= each);
    if (satisfied.length === 0) {
      for (const index of open) shares[index] += each;
      break;
    }
    for (const index of satisfied) {
      left -= demands[index] - shares[index];
      shares[index] = demands[index];
    }
    open = open.filter((index) => !satisfied.includes(index));
  }
  return shares;
}
