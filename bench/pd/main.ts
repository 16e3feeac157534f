/**
 * npm run bench:pd [-- --requests N --rounds N --quick]
 *
 * Prefill/decode disaggregation against the mocks (docs/disaggregation.md, "Cost"):
 * 1. gateway CPU per disaggregated request as a ratio to a whole request through the same
 *    router code (target ≤ 2.0×: two legs and one small JSON parse), both gateways in their own
 *    processes, measured side by side in interleaved rounds from /proc CPU time (user + system),
 *    which descheduled time does not inflate on a shared machine;
 * 2. the gateway's own gap between reading a prefill answer and dispatching its decode leg
 *    (target p99 ≤ 1 ms), one request at a time, as the gateway process's CPU time (which a
 *    shared machine's other work does not inflate) and as wall-clock time (which it does);
 * 3. the prefill ranks' prefix-cache hit rate on a shared-prefix workload, prefix-aware
 *    prefill vs round-robin prefill (target ≥ 3×).
 */
import { Agent, createServer as createHttpServer, request } from 'node:http';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { startMockVllm } from '../../example-server/mock-vllm';
import { dpRouter, type PolicyName } from '../../lib';
import { processCpuMs, startChild, type BenchChild } from '../lib/cpu';
import { fixed, markdownTable, median, parseArgs, quantileSorted } from '../lib/stats';

const args = parseArgs(process.argv.slice(2));
const QUICK = args.has('quick');
const REQUESTS = Number(args.get('requests') ?? (QUICK ? 300 : 2000));
const ROUNDS = Number(args.get('rounds') ?? (QUICK ? 3 : 7));
const CONCURRENCY = 8;
const BODY = JSON.stringify({ model: 'mock-model', prompt: 'You are a helpful assistant. '.repeat(16) + 'Summarise the report.', max_tokens: 4 });

async function main(): Promise<void> {
  const [prefillPort, decodePort] = [await freePort(), await freePort()];
  const upstreams = await startChild('upstreams', join(__dirname, 'upstreams.ts'), [], undefined, { PREFILL_PORT: String(prefillPort), DECODE_PORT: String(decodePort) });
  const urls = [`http://127.0.0.1:${prefillPort}`, `http://127.0.0.1:${decodePort}`];
  const gateways = await Promise.all(['whole', 'pd'].map((mode) => startChild(mode, join(__dirname, 'gateway.ts'), [mode, ...urls], undefined)));
  const agent = new Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  try {
    const perRequest = new Map<string, number[]>(gateways.map((gateway) => [gateway.name, []]));
    for (const gateway of gateways) await load(agent, gateway, REQUESTS / 2);
    await fetchGaps(gateways[1]);
    for (let round = 0; round < ROUNDS; round++) {
      for (const gateway of round % 2 === 0 ? gateways : [...gateways].reverse()) {
        const before = processCpuMs(gateway.process.pid)!;
        await load(agent, gateway, REQUESTS);
        perRequest.get(gateway.name)!.push(((processCpuMs(gateway.process.pid)! - before) * 1000) / REQUESTS);
      }
    }
    const whole = median(perRequest.get('whole')!);
    const pd = median(perRequest.get('pd')!);
    // The gap alone, one request at a time: under concurrency it also holds other requests' turns.
    await fetchGaps(gateways[1]);
    const sequential = new Agent({ keepAlive: true, maxSockets: 1 });
    for (let turn = 0; turn < REQUESTS; turn++) await post(sequential, gateways[1].port, '/v1/completions', BODY);
    sequential.destroy();
    const measured = await fetchGaps(gateways[1]);
    const wallGaps = measured.map(([wall]) => wall).sort((a, b) => a - b);
    const cpuGaps = measured.map(([, cpu]) => cpu).sort((a, b) => a - b);
    const hit = { 'prefix-aware': await hitRate('prefix-aware'), 'round-robin': await hitRate('round-robin') };
    process.stdout.write(`${ROUNDS} rounds of ${REQUESTS} requests per gateway, ${CONCURRENCY} concurrent; CPU from /proc (user + system)\n\n`);
    process.stdout.write(
      `${markdownTable(
        ['figure', 'value', 'target'],
        [
          ['gateway CPU, whole request (µs/req)', fixed(whole, 0), ''],
          ['gateway CPU, disaggregated request (µs/req)', fixed(pd, 0), ''],
          ['disaggregated / whole', `${fixed(pd / whole, 2)}×`, '≤ 2.0×'],
          ['prefill answer → decode dispatch, CPU, p50 (ms)', fixed(quantileSorted(cpuGaps, 0.5), 3), ''],
          ['prefill answer → decode dispatch, CPU, p99 (ms)', fixed(quantileSorted(cpuGaps, 0.99), 3), '≤ 1 ms'],
          ['prefill answer → decode dispatch, wall clock, p50 (ms)', fixed(quantileSorted(wallGaps, 0.5), 3), ''],
          ['prefill answer → decode dispatch, wall clock, p99 (ms)', fixed(quantileSorted(wallGaps, 0.99), 3), '(loaded machine)'],
          ['prefill cache hit rate, prefix-aware', `${fixed(hit['prefix-aware'] * 100, 1)} %`, ''],
          ['prefill cache hit rate, round-robin', `${fixed(hit['round-robin'] * 100, 1)} %`, ''],
          ['prefix-aware / round-robin', `${fixed(hit['prefix-aware'] / hit['round-robin'], 1)}×`, '≥ 3×'],
        ],
      )}\n`,
    );
  } finally {
    agent.destroy();
    await Promise.all([...gateways, upstreams].map((child) => child.stop()));
  }
}

/** `count` requests to one gateway, `CONCURRENCY` at a time; every answer must be a 200. */
async function load(agent: Agent, gateway: BenchChild, count: number): Promise<void> {
  let sent = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (sent < count) {
        sent++;
        const status = await post(agent, gateway.port, '/v1/completions', BODY);
        if (status !== 200) throw new Error(`${gateway.name} answered ${status}`);
      }
    }),
  );
}

function post(agent: Agent, port: number, path: string, body: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const outgoing = request({ host: '127.0.0.1', port, path, method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (response) => {
      response.resume();
      response.on('end', () => resolve(response.statusCode ?? 0));
    });
    outgoing.on('error', reject);
    outgoing.end(body);
  });
}

async function fetchGaps(gateway: BenchChild): Promise<Array<[number, number]>> {
  return (await (await fetch(`${gateway.url}/bench/gaps`)).json()) as Array<[number, number]>;
}

/**
 * The prefill ranks' hit rate (cached / prompt tokens) on 32 conversations' worth of shared
 * system prompts (2 KiB each) with distinct questions, 8 prefill ranks each caching a quarter
 * of the prompts' blocks: picking by prefix keeps each prompt on the ranks that hold it.
 */
async function hitRate(prefillPolicy: PolicyName): Promise<number> {
  const prefill = await startMockVllm({ role: 'prefill', dataParallelSize: 8, cacheBlocksPerRank: 256 });
  const decode = await startMockVllm({ role: 'decode', dataParallelSize: 2 });
  const router = dpRouter({
    upstreams: [
      { url: prefill.url, dataParallelSize: 8, role: 'prefill' },
      { url: decode.url, dataParallelSize: 2, role: 'decode' },
    ],
    disaggregation: { prefillPolicy },
    metrics: { registry: new Registry() },
  });
  const server = createHttpServer((req, res) => router(req, res, () => res.end()));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  const agent = new Agent({ keepAlive: true, maxSockets: 4 });
  try {
    const prompts = Array.from({ length: 32 }, (_, index) => `System prompt ${index}: ${'policy text '.repeat(170)}`);
    const turns = QUICK ? 400 : 1600;
    // A seeded draw (an LCG, its high bits: its low bits repeat with a period the ranks divide), the same for both policies.
    let seed = 42;
    for (let turn = 0; turn < turns; turn++) {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
      const system = prompts[(seed >>> 16) % prompts.length];
      const body = JSON.stringify({ model: 'mock-model', messages: [{ role: 'system', content: system }, { role: 'user', content: `question ${turn}` }], max_tokens: 2 });
      const status = await post(agent, port, '/v1/chat/completions', body);
      if (status !== 200) throw new Error(`hit-rate run answered ${status}`);
    }
    const ranks = Object.values(prefill.stats().perRank);
    const cached = ranks.reduce((sum, rank) => sum + rank.cachedTokens, 0);
    const prompt = ranks.reduce((sum, rank) => sum + rank.promptTokens, 0);
    return cached / prompt;
  } finally {
    agent.destroy();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await router.close();
    await prefill.close();
    await decode.close();
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error instanceof Error ? (error.stack ?? error.message) : error)}\n`);
  process.exit(1);
});
