/**
 * npm run bench:receipts [-- --requests N] [--quick] [--only detect|healthy|cost] [--no-cost] [--pairs N] [--cost-blocks N] [--cost-a X --cost-b Y] [--tsx] [--out FILE]
 *
 * Route receipts against the mock vLLM (4 ranks, KV events on ZeroMQ, real HTTP on loopback):
 *
 * 1. Detection: per fault, how many requests the gateway takes, from the fault on, to log it
 *    (an error line for a rank header not honoured, a notice for an index not trusted): a relay
 *    stripping the rank header, vLLM ignoring it on one path, `rankHeader: 'none'` where the
 *    header matters, blocks the engine drops without events, a chat template that drifts.
 *    Each after 100 healthy requests, none of which may raise anything.
 * 2. False alarms: a healthy upstream for `--requests` (100,000) requests with 1 % of its KV-event
 *    batches lost (no replay socket: a lost batch clears its rank's index); and how close the exact
 *    predictions of cached tokens came to what the engine reported, in a run without loss.
 * 3. Cost: CPU per request of two gateway processes, receipts on and `receipts: false`, fed
 *    alternately from one client, block by block, in 5 pairs of fresh processes (the interleaved
 *    A/B of bench/overhead).
 *
 * Eight clients, half the requests streamed. Writes bench/results/receipts-<time>.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { UpstreamBook } from '../../lib/receipts/book';
import { drifting, stripping } from '../lib/relay';
import { coreCount, hasTaskset, pinSelf, processCpuMs, startChild } from '../lib/cpu';
import { fixed, markdownTable, median, parseArgs, percent } from '../lib/stats';
import { libraryBuildFrom, prepareLibrary } from '../overhead/contender-process';
import { metricSum, RANKS, startFleet, type Fleet, type FleetOptions } from './fleet';
import { drive, workload } from './workload';
import { seededRng } from '../routing/rng';
import { startMockVllm } from '../../example-server/mock-vllm';

const CLIENTS = 8;
const WARMUP = 100;
const DETECT_LIMIT = 2000;
const ROOT = resolve(__dirname, '..', '..');

interface Fault {
  readonly name: string;
  /** `error`: a rank header not honoured; `notice`: an index not trusted. */
  readonly shows: 'error' | 'notice';
  readonly fleet: (on: () => boolean) => FleetOptions;
  /** Turns the fault on (after the warm-up), and is told each request sent from then on. */
  readonly inject?: (fleet: Fleet) => void;
  readonly each?: (fleet: Fleet, sent: number) => void;
  /** Faults present from the start (a configuration) have no warm-up. */
  readonly fromStart?: boolean;
  readonly completions?: boolean;
}

const FAULTS: readonly Fault[] = [
  { name: 'a relay strips the rank header', shows: 'error', fleet: (on) => ({ relay: (path, headers, body) => (on() ? stripping('x-data-parallel-rank')(path, headers, body) : body) }) },
  {
    name: 'vLLM ignores the header on /v1/chat/completions',
    shows: 'error',
    completions: true,
    fleet: () => ({}),
    inject: (fleet) => (fleet.mock.ignoreRankHeader = { paths: ['/v1/chat/completions'] }),
  },
  { name: "`rankHeader: 'none'` where the header matters", shows: 'error', fromStart: true, fleet: () => ({ upstream: { rankHeader: 'none' } }) },
  {
    name: 'the engine drops blocks without events (every 25 requests)',
    shows: 'notice',
    fleet: () => ({}),
    inject: (fleet) => fleet.mock.dropBlocksSilently(),
    each: (fleet, sent) => {
      if (sent % 25 === 24) fleet.mock.dropBlocksSilently();
    },
  },
  { name: 'the chat template drifts on the engine', shows: 'notice', fleet: (on) => ({ relay: drifting(on) }) },
];

interface Detection {
  fault: string;
  warmupAlarms: number;
  requests: number | undefined;
  line: string | undefined;
}

async function detect(fault: Fault, seed: number): Promise<Detection> {
  let on = false;
  const fleet = await startFleet(fault.fleet(() => on));
  try {
    const next = workload(seed, fault.completions);
    const alarms = () => fleet.errors.length + fleet.warnings.length;
    let offset = 0;
    if (!fault.fromStart) {
      offset = await drive(fleet.url, next, CLIENTS, WARMUP);
    }
    const warmupAlarms = alarms();
    on = true;
    fault.inject?.(fleet);
    const lines = fault.shows === 'error' ? fleet.errors : fleet.warnings;
    const before = lines.length;
    let detectedAt: number | undefined;
    await drive(
      fleet.url,
      (i) => {
        fault.each?.(fleet, i);
        return next(offset + i);
      },
      CLIENTS,
      DETECT_LIMIT,
      (sent) => {
        if (detectedAt === undefined && lines.length > before) detectedAt = sent;
        return detectedAt !== undefined;
      },
    );
    return { fault: fault.name, warmupAlarms, requests: detectedAt, line: lines[before] };
  } finally {
    await fleet.close();
  }
}
/** Every exact prediction's error against the engine's report, in tokens, and the block size. */
const predictions: Array<[predicted: number, reported: number, block: number]> = [];
// The bench's window on the router: each exact usage receipt's two figures (no hook in lib/ for it).
const usage = UpstreamBook.prototype.usage;
UpstreamBook.prototype.usage = function recorded(this: UpstreamBook, ticket, reported) {
  const counted = usage.call(this, ticket, reported);
  if (ticket.index === 'exact' && counted !== undefined) predictions.push([counted.predicted, counted.reported, ticket.blockSize]);
  return counted;
};

/** A healthy upstream for `requests` requests, a share `loss` of its KV-event batches lost on the wire (repaired from its replay socket, or not: `replay`). */
async function healthy(requests: number, loss: number, replay: boolean, seed: number, usageEvery?: number) {
  const fleet = await startFleet({ mock: { kvEvents: { replayPort: replay ? 0 : null } }, ...(usageEvery !== undefined && { receipts: { usageEvery } }) });
  predictions.length = 0;
  try {
    const random = seededRng(seed + 1);
    const next = workload(seed);
    const started = performance.now();
    await drive(
      fleet.url,
      (i) => {
        if (random() < loss) fleet.mock.kvEvents!.drop(Math.floor(random() * RANKS));
        return next(i);
      },
      CLIENTS,
      requests,
    );
    const seconds = (performance.now() - started) / 1000;
    const outcomes = Object.fromEntries(await Promise.all(['confirmed', 'elsewhere', 'unseen', 'cached'].map(async (outcome) => [outcome, await metricSum(fleet.router, 'dp_router_route_receipts_total', { outcome })] as const)));
    const within = predictions.filter(([predicted, reported, block]) => Math.abs(predicted - reported) <= block).length;
    const exactMatch = predictions.filter(([predicted, reported]) => predicted === reported).length;
    return { requests, loss, replay, seconds, alarms: [...fleet.errors, ...fleet.warnings], outcomes, predictions: predictions.length, withinOneBlock: within / Math.max(1, predictions.length), exact: exactMatch / Math.max(1, predictions.length) };
  } finally {
    await fleet.close();
  }
}

/**
 * CPU per request of two gateway processes, fed alternately: `pairs` pairs of fresh processes
 * (where one process's hidden classes land in memory moves its CPU per request by a few percent
 * for its whole life, bench/overhead/interleaved.ts), `blocks` blocks each; the median of the
 * pairs' median ratios.
 */
async function cost(pairs: number, blocks: number, blockSize: number, build: 'dist' | 'tsx', modes: readonly [string, string]) {
  prepareLibrary(build, []);
  const pinned = coreCount() >= 2 && hasTaskset() && pinSelf(0);
  const mock = await startMockVllm({ dataParallelSize: RANKS, kvEvents: {} });
  const kv = mock.kvEvents!;
  const events = JSON.stringify({ endpoint: kv.endpoints, replayEndpoint: kv.replayEndpoints });
  const env = build === 'dist' ? { DP_ROUTER_BENCH_LIB: join(ROOT, 'dist', 'cjs', 'index.js') } : {};
  const next = workload(11);
  let sent = 0;
  const pairRatios: number[] = [];
  const costs: Array<[number, number]> = [];
  try {
    for (let pair = 0; pair < pairs; pair++) {
      const gateways = await Promise.all(modes.map((mode) => startChild(`receipts ${mode}`, join(__dirname, 'gateway.ts'), [mock.url, events, kv.tokenizer, mode], pinned ? 1 : undefined, env)));
      try {
        const block = async (count: number) => {
          const before = gateways.map((child) => processCpuMs(child.process.pid)!);
          await drive((i) => gateways[(sent + i) % 2].url, (i) => next(sent + i), CLIENTS, count);
          sent += count;
          return gateways.map((child, at) => ((processCpuMs(child.process.pid)! - before[at]) * 1000) / (count / 2));
        };
        await block(2 * blockSize);
        const ratios: number[] = [];
        for (let index = 0; index < blocks; index++) {
          const [a, b] = await block(blockSize);
          ratios.push(a / b);
          costs.push([a, b]);
        }
        pairRatios.push(median(ratios));
        console.log(`pair ${pair + 1}: ${modes[0]} / ${modes[1]} per block ${ratios.map((ratio) => ratio.toFixed(3)).join(', ')}; median ${median(ratios).toFixed(3)}`);
      } finally {
        await Promise.all(gateways.map((child) => child.stop()));
      }
    }
  } finally {
    await mock.close();
  }
  return { pinned, blockSize, pairRatios, ratio: median(pairRatios), a: median(costs.map(([a]) => a)), b: median(costs.map(([, b]) => b)) };
}

async function main(): Promise<void> {
  const { build, rest } = libraryBuildFrom(process.argv.slice(2));
  const args = parseArgs(rest);
  const quick = args.has('quick');
  const requests = Number(args.get('requests') ?? (quick ? 5000 : 100_000));
  const costBlocks = Number(args.get('cost-blocks') ?? (quick ? 3 : 4));
  const costPairs = Number(args.get('pairs') ?? (quick ? 1 : 5));
  const only = args.get('only');
  const runs = (section: string) => only === undefined || only === section;
  const detections: Detection[] = [];
  if (runs('detect')) console.log('## Detection (requests from the fault on, 8 clients)\n');
  for (const [at, fault] of runs('detect') ? FAULTS.entries() : []) {
    const found = await detect(fault, 100 + at);
    detections.push(found);
    console.log(`${found.fault}: ${found.requests ?? `not within ${DETECT_LIMIT}`}${found.warmupAlarms > 0 ? ` (ALARM during warm-up: ${found.warmupAlarms})` : ''}`);
  }
  if (detections.length > 0) {
    console.log(`\n${markdownTable(['fault', 'requests to detect', 'alarms in the 100 healthy before'], detections.map((one) => [one.fault, String(one.requests ?? `> ${DETECT_LIMIT}`), String(one.warmupAlarms)]))}\n`);
    for (const one of detections) if (one.line !== undefined) console.log(`- ${one.line}`);
  }

  const lossy: Array<Awaited<ReturnType<typeof healthy>>> = [];
  let clean: Awaited<ReturnType<typeof healthy>> | undefined;
  if (runs('healthy')) {
    for (const replay of [true, false]) {
      console.log(`\n## Healthy upstream, 1 % of KV-event batches lost (${replay ? 'repaired from the replay socket' : 'no replay socket: each loss clears the rank'}): ${requests} requests\n`);
      const run = await healthy(requests, 0.01, replay, 7);
      lossy.push(run);
      console.log(`false alarms: ${run.alarms.length}${run.alarms.length > 0 ? `\n${run.alarms.join('\n')}` : ''}; receipts ${JSON.stringify(run.outcomes)}; ${fixed(run.requests / run.seconds, 0)} req/s`);
    }
    // Every answer's usage read: each prediction is compared.
    clean = await healthy(Math.min(requests, 20_000), 0, true, 8, 1);
    console.log(`\n## Exact predictions against reported cached tokens, no loss: ${clean.requests} requests\n`);
    console.log(`${clean.predictions} exact usage receipts: ${percent(clean.withinOneBlock)} within one block, ${percent(clean.exact)} exactly; receipts ${JSON.stringify(clean.outcomes)}; false alarms ${clean.alarms.length}`);
  }

  let costResult: Awaited<ReturnType<typeof cost>> | undefined;
  if (runs('cost') && !args.has('no-cost')) {
    // `--cost-a`, `--cost-b`: other receipts settings to compare (JSON, or on / off).
    const modes = [String(args.get('cost-a') ?? 'on'), String(args.get('cost-b') ?? 'off')] as const;
    console.log(`\n## Cost: CPU per request, receipts ${modes[0]} against ${modes[1]} (interleaved, ${costPairs} pairs of processes, ${costBlocks} blocks each)\n`);
    costResult = await cost(costPairs, costBlocks, quick ? 1000 : 2000, build, modes);
    console.log(`median of pairs: ${modes[0]} ${costResult.a.toFixed(1)} µs/req, ${modes[1]} ${costResult.b.toFixed(1)} µs/req, ${modes[0]} / ${modes[1]} = ${costResult.ratio.toFixed(3)}${costResult.pinned ? ' (both gateways on core 1)' : ' (not pinned)'}`);
  }

  const headerFaults = detections.filter((one) => FAULTS.find((fault) => fault.name === one.fault)!.shows === 'error');
  const targets = [
    ...(detections.length === 0
      ? []
      : [{ name: 'rank header faults detected within 50 requests', pass: headerFaults.every((one) => one.requests !== undefined && one.requests <= 50) && detections.every((one) => one.warmupAlarms === 0), figure: headerFaults.map((one) => one.requests ?? 'never').join(', ') }]),
    ...(clean === undefined
      ? []
      : [
          { name: `0 false alarms over ${requests} requests with 1 % event loss, with and without replay`, pass: lossy.every((run) => run.alarms.length === 0), figure: lossy.map((run) => run.alarms.length).join(', ') },
          { name: 'exact predictions within one block for >= 99 %', pass: clean.withinOneBlock >= 0.99, figure: percent(clean.withinOneBlock) },
        ]),
    ...(costResult === undefined ? [] : [{ name: 'CPU per request with receipts <= 1.02 x without', pass: costResult.ratio <= 1.02, figure: costResult.ratio.toFixed(3) }]),
  ];
  console.log('');
  for (const target of targets) console.log(`${target.pass ? 'PASS' : 'MISS'} ${target.name}: ${target.figure}`);
  const out = typeof args.get('out') === 'string' ? (args.get('out') as string) : join(ROOT, 'bench', 'results', `receipts-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  mkdirSync(resolve(out, '..'), { recursive: true });
  writeFileSync(out, JSON.stringify({ detections, lossy, clean, cost: costResult, targets }, null, 2));
  console.log(`\nwrote ${out}`);
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
