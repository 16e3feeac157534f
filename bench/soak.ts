/**
 * A bounded soak of the router under injected faults, on loopback: two mock vLLM servers
 * (2 ranks each) behind an Express gateway, a keep-alive client firing plain, streamed and
 * client-aborted completions, while one upstream cycles through faults (5xx answers, resets,
 * stalls, deaths mid-stream, a kill and a restart). It stops by itself after `--requests` or
 * `--max-seconds`, waits for every in-flight count to drain, and prints the figures as JSON
 * (also written to `--out FILE`): outcomes, upstream errors by kind, final in-flight per
 * endpoint, RSS and heap before and after.
 *
 *   npm run soak -- --requests 100000 --concurrency 32 [--phases 24] [--max-seconds 600] [--out FILE]
 *
 * Exits 1 when an in-flight count does not return to 0 or the heap grew beyond `--max-heap-growth-mb`.
 */
import express from 'express';
import { writeFileSync } from 'node:fs';
import { Agent, createServer, request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Registry } from 'prom-client';
import { startMockVllm, type MockFault, type MockVllm } from '../example-server/mock-vllm';
import { dpRouter } from '../lib';

/** Settings of one soak run. */
export interface SoakOptions {
  /** Requests to send in all. Default: `100_000`. */
  requests?: number;
  /** Requests in flight at once. Default: `32`. */
  concurrency?: number;
  /** Stop sending after this long even if `requests` were not all sent. Default: `600`. */
  maxSeconds?: number;
  /** Fault phases over the run (each a share of the requests). Default: `24`. */
  phases?: number;
  /** Print progress lines. Default: `false`. */
  verbose?: boolean;
}

/** What a soak run measured. */
export interface SoakFigures {
  requests: number;
  seconds: number;
  /** Client-side outcomes: `status_<code>`, `cut` (stream ended early), `client_abort` (by design). */
  outcomes: Record<string, number>;
  /** `dp_router_upstream_errors_total` by kind. */
  upstreamErrors: Record<string, number>;
  /** Requests each endpoint was sent (retries included). */
  dispatched: Record<string, number>;
  /** In-flight per endpoint after the run drained: all must be 0. */
  finalInflight: Record<string, number>;
  /** Requests the mock engines still count as running: all must be 0. */
  engineRunning: number;
  memory: { rssBeforeMb: number; rssAfterMb: number; heapBeforeMb: number; heapAfterMb: number };
}

/** The fault cycle applied to upstream `b`, one phase each. `kill` closes it; the next phase restarts it. */
const FAULT_CYCLE: Array<MockFault | 'kill' | undefined> = [
  undefined,
  { kind: 'status', status: 500 },
  undefined,
  { kind: 'reset' },
  undefined,
  { kind: 'stall' },
  undefined,
  { kind: 'die-mid-stream', afterChunks: 1 },
  undefined,
  'kill',
];

const MB = 1024 * 1024;

/** Runs one soak; resolves with its figures once every in-flight count has drained. */
export async function runSoak(options: SoakOptions = {}): Promise<SoakFigures> {
  const total = options.requests ?? 100_000;
  const concurrency = options.concurrency ?? 32;
  const maxMs = (options.maxSeconds ?? 600) * 1000;
  const phases = options.phases ?? 24;
  const phaseLength = Math.max(1, Math.ceil(total / phases));
  const log = options.verbose ? (line: string) => process.stdout.write(`${line}\n`) : () => undefined;
  const gc = exposeGc();

  const a = await startMockVllm({ dataParallelSize: 2, startRank: 0 });
  let b: MockVllm | undefined = await startMockVllm({ dataParallelSize: 2, startRank: 2 });
  const bPort = b.port;
  const registry = new Registry();
  const router = dpRouter({
    upstreams: [
      { url: a.url, name: 'a', dataParallelSize: 2 },
      { url: b.url, name: 'b', dataParallelSize: 2, startRank: 2 },
    ],
    metrics: { registry },
    timeouts: { connectMs: 500, firstByteMs: 250 },
    // Every client of this run shares one address: let each request failure count.
    outlierDetection: { consecutiveFailures: 3, baseEjectionMs: 100, maxEjectionMs: 400, minimumClients: 1 },
    healthCheck: { intervalMs: 100, timeoutMs: 1000 },
    // The run takes upstream b down on purpose: its health transitions are expected, anything
    // else the router warns about is not, and goes to stderr, which the soak test reads.
    logger: {
      warn: (message: string) => {
        if (!message.includes('health check')) process.stderr.write(`${message}\n`);
      },
    },
  });
  const app = express();
  app.use(router);
  const server: Server = createServer(app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/completions`;
  const agent = new Agent({ keepAlive: true, maxSockets: concurrency });

  const outcomes: Record<string, number> = {};
  const count = (outcome: string) => (outcomes[outcome] = (outcomes[outcome] ?? 0) + 1);
  const started = Date.now();
  let sent = 0;
  let phase = -1;
  let before: NodeJS.MemoryUsage | undefined;

  const setPhase = async (next: number) => {
    phase = next;
    const fault = FAULT_CYCLE[phase % FAULT_CYCLE.length];
    if (b === undefined) b = await startMockVllm({ dataParallelSize: 2, startRank: 2, port: bPort });
    if (fault === 'kill') {
      const closing = b;
      b = undefined;
      await closing.close();
    } else {
      b.fault = fault;
    }
    log(`phase ${phase}: ${fault === undefined ? 'no fault' : fault === 'kill' ? 'killed' : fault.kind} after ${sent} requests`);
  };

  const one = (index: number) =>
    new Promise<void>((resolve) => {
      const kind = index % 10; // 0-6 plain, 7-8 streamed, 9 streamed and abandoned by the client
      const stream = kind >= 7;
      const body = JSON.stringify({ model: 'mock-model', prompt: `soak ${index % 97}`, max_tokens: stream ? 4 : 2, stream });
      const outgoing = httpRequest(url, { method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } });
      let done = false;
      const finish = (outcome: string) => {
        if (done) return;
        done = true;
        count(outcome);
        resolve();
      };
      outgoing.on('response', (response) => {
        const status = `status_${response.statusCode}`;
        if (kind === 9 && response.statusCode === 200) {
          response.once('data', () => {
            outgoing.destroy();
            finish('client_abort');
          });
        }
        response.on('data', () => undefined);
        response.on('end', () => finish(status));
        response.on('error', () => finish('cut'));
        response.on('aborted', () => finish('cut'));
      });
      outgoing.on('error', () => finish('cut'));
      outgoing.end(body);
    });

  const worker = async () => {
    while (sent < total && Date.now() - started < maxMs) {
      const index = sent++;
      const wantedPhase = Math.floor(index / phaseLength);
      if (wantedPhase !== phase) await setPhase(wantedPhase);
      if (index === Math.min(2000, Math.floor(total / 10))) {
        gc?.();
        before = process.memoryUsage();
      }
      await one(index);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  const seconds = (Date.now() - started) / 1000;

  // Bring `b` back without faults and let every request drain.
  if (b === undefined) b = await startMockVllm({ dataParallelSize: 2, startRank: 2, port: bPort });
  b.fault = undefined;
  const drainDeadline = Date.now() + 10_000;
  while (router.endpoints().some((endpoint) => endpoint.inflight !== 0) && Date.now() < drainDeadline) await sleep(20);
  agent.destroy();
  await sleep(50);
  gc?.();
  const after = process.memoryUsage();
  before ??= after;

  const samples = await registry.getMetricsAsJSON();
  const sumBy = (name: string, label: string) => {
    const sums: Record<string, number> = {};
    const metric = samples.find((entry) => entry.name === name) as { values: Array<{ labels: Record<string, string | number>; value: number }> } | undefined;
    for (const sample of metric?.values ?? []) {
      const key = label === 'endpoint' ? `${sample.labels.upstream}#${sample.labels.rank}` : String(sample.labels[label]);
      sums[key] = (sums[key] ?? 0) + sample.value;
    }
    return sums;
  };
  const finalInflight = Object.fromEntries(router.endpoints().map((endpoint) => [`${endpoint.upstream}#${endpoint.rank}`, endpoint.inflight]));
  const running = [a, b].reduce((sum, mock) => sum + Object.values(mock.stats().perRank).reduce((inner, rank) => inner + rank.running, 0), 0);

  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  await router.close();
  await Promise.all([a.close(), b.close()]);

  return {
    requests: sent,
    seconds,
    outcomes,
    upstreamErrors: sumBy('dp_router_upstream_errors_total', 'kind'),
    dispatched: sumBy('dp_router_requests_total', 'endpoint'),
    finalInflight,
    engineRunning: running,
    memory: {
      rssBeforeMb: round(before.rss / MB),
      rssAfterMb: round(after.rss / MB),
      heapBeforeMb: round(before.heapUsed / MB),
      heapAfterMb: round(after.heapUsed / MB),
    },
  };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function round(value: number): number {
  return Math.round(value * 10) / 10;
}

/** A full GC makes the heap figures comparable; exposed at run time when node was not started with --expose-gc. */
function exposeGc(): (() => void) | undefined {
  const existing = (globalThis as { gc?: () => void }).gc;
  if (existing) return existing;
  try {
    setFlagsFromString('--expose-gc');
    return runInNewContext('gc') as () => void;
  } catch {
    return undefined;
  }
}

function argument(name: string, fallback: number): number {
  const index = process.argv.indexOf(`--${name}`);
  if (index === -1) return fallback;
  const value = Number(process.argv[index + 1]);
  if (!Number.isFinite(value) || value <= 0) throw new TypeError(`--${name} must be a positive number`);
  return value;
}

async function main(): Promise<void> {
  const maxHeapGrowthMb = argument('max-heap-growth-mb', 32);
  const figures = await runSoak({
    requests: argument('requests', 100_000),
    concurrency: argument('concurrency', 32),
    maxSeconds: argument('max-seconds', 600),
    phases: argument('phases', 24),
    verbose: process.argv.includes('--verbose'),
  });
  const json = `${JSON.stringify(figures, null, 2)}\n`;
  process.stdout.write(json);
  const out = process.argv.indexOf('--out');
  if (out !== -1 && process.argv[out + 1]) writeFileSync(process.argv[out + 1], json);
  const leaked = Object.entries(figures.finalInflight).filter(([, inflight]) => inflight !== 0);
  const growth = figures.memory.heapAfterMb - figures.memory.heapBeforeMb;
  const rate = Math.round(figures.requests / figures.seconds);
  process.stdout.write(`${figures.requests} requests in ${figures.seconds.toFixed(1)} s (${rate}/s); heap ${figures.memory.heapBeforeMb} → ${figures.memory.heapAfterMb} MB\n`);
  if (leaked.length > 0 || figures.engineRunning !== 0) {
    process.stderr.write(`in-flight did not return to 0: ${JSON.stringify(leaked)}, engine running ${figures.engineRunning}\n`);
    process.exitCode = 1;
  }
  if (growth > maxHeapGrowthMb) {
    process.stderr.write(`heap grew by ${growth.toFixed(1)} MB (limit ${maxHeapGrowthMb} MB)\n`);
    process.exitCode = 1;
  }
}

if (require.main === module) {
  main().catch((error: unknown) => {
    process.stderr.write(`${String(error)}\n`);
    process.exitCode = 1;
  });
}
