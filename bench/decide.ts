/**
 * npm run bench:decide [-- --quick] [-- --out FILE]
 *
 * Decision time per pick of every built-in policy, driven directly with the router's own
 * endpoint objects (`RouteEndpoint`, whose `load` is a getter) at 8, 64 and 512 endpoints,
 * and prefix-aware on 1 KB / 8 KB / 64 KB prompts. The loop keeps a sliding window of
 * in-flight requests (each pick takes a slot on the chosen endpoint, the pick 2×N earlier
 * gives its slot back), so loads move as they do under traffic; the `harness` row is that
 * bookkeeping with a constant pick, included in every other row.
 *
 * With `slo`: the same prefix-aware pick steered by SLO routing (lib/slo), its latency model
 * warm and every candidate predicted, half the requests with objectives (the choice among the
 * candidates) and half without (where they cost the others least), side by side with the
 * unsteered pick of the same run.
 *
 * Also measured, for context: what a prefix-aware request costs before the pick (JSON.parse
 * and prompt extraction of the body), and the rank handler's whole per-request work
 * (hint stripping, decision, metrics) with and without prom-client metrics.
 *
 * Batches are timed in this process's CPU time, not wall time (see `cpuNow`).
 *
 * Writes bench/results/decide-<time>.json, prints Markdown tables and PASS/MISS lines.
 */
import { EventEmitter } from 'node:events';
import { mkdirSync, writeFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { join, resolve } from 'node:path';
import { Registry } from 'prom-client';
import { RouteEndpoint } from '../lib/upstreams/endpoints';
import type { UpstreamConfig } from '../lib/options';
import { leastOutstanding } from '../lib/policies/least-outstanding';
import { powerOfTwo } from '../lib/policies/power-of-two';
import { prefixAware } from '../lib/policies/prefix-aware';
import { random } from '../lib/policies/random';
import { roundRobin } from '../lib/policies/round-robin';
import { sessionAffinity } from '../lib/policies/session-affinity';
import { extractPrompt } from '../lib/request/prompt';
import type { RoutedRequest } from '../lib/request/route-state';
import { parseOptions } from '../lib/options';
import { RequestLifecycle } from '../lib/request/lifecycle';
import { RouterServices } from '../lib/compose/services';
import type { PickContext, Policy } from '../lib/types';
import { createSloMetrics } from '../lib/slo/metrics';
import { parseSlo } from '../lib/slo/options';
import { SloRouting, type SloTicket } from '../lib/slo/slo-routing';
import { fixed, markdownTable, median, parseArgs } from './lib/stats';

const args = parseArgs(process.argv.slice(2));
if (args.has('help')) {
  process.stdout.write('npm run bench:decide -- [--quick] [--out FILE]\n');
  process.exit(0);
}
const QUICK = args.has('quick');
/** Timed batches per cell; the figure is the median batch. */
const BATCHES = QUICK ? 5 : 11;
const BATCH_MS = QUICK ? 20 : 60;
/**
 * CPU time every cell warms up for at least. A policy's code is optimised after thousands of
 * picks and re-optimised after each early deopt, and the compiler thread's time counts in
 * `process.cpuUsage`: without this, a cell's first ~12,000 picks (100 ms and more) ran 2–8×
 * slower, which was taken for "the first policy instance is slower".
 */
const WARM_MS = QUICK ? 250 : 1000;
const ENDPOINT_COUNTS = [8, 64, 512];
const PROMPT_SIZES = [1024, 8192, 65536];
/** The prompt size of the SLO-steered cells. */
const SLO_PROMPT_BYTES = 8192;

/** Endpoints as the router builds them: upstreams of 8 ranks each. */
function makeEndpoints(count: number): RouteEndpoint[] {
  const endpoints: RouteEndpoint[] = [];
  for (let upstream = 0; endpoints.length < count; upstream++) {
    const size = Math.min(8, count - endpoints.length);
    const config: UpstreamConfig = {
      name: `http://10.0.0.${upstream + 1}:8000`,
      url: `http://10.0.0.${upstream + 1}:8000`,
      startRank: upstream * 8,
      dataParallelSize: size,
      ranks: Array.from({ length: size }, (_, i) => upstream * 8 + i),
      rankHeader: 'global',
      discoverIntervalMs: undefined,
      role: 'both',
    };
    for (const rank of config.ranks) endpoints.push(new RouteEndpoint(config, rank));
  }
  return endpoints;
}

/** Prompts whose prefixes repeat as real traffic's do: 8 system prompts × many conversations. */
function makePrompts(size: number, count: number): string[] {
  const words = ['alpha', 'bravo', 'charlie', 'delta', 'echo', 'foxtrot', 'golf', 'hotel', 'india', 'juliet'];
  const prompts: string[] = [];
  for (let i = 0; i < count; i++) {
    let text = `system prompt ${i % 8}: you are a helpful assistant. `.repeat(Math.max(1, Math.floor(size / 2 / 48)));
    text += `conversation ${i}: `;
    for (let w = 0; text.length < size; w++) text += `${words[(w * (i + 3)) % words.length]} `;
    // A flat string, as JSON.parse produces (concatenation builds a rope).
    prompts.push(JSON.parse(JSON.stringify(text.slice(0, size))) as string);
  }
  return prompts;
}

interface Cell {
  policy: string;
  endpoints: number;
  promptBytes?: number;
  nsPerPick: number;
  picks: number;
}

let sink = 0;

/**
 * CPU time of this process in nanoseconds. Batches are timed in CPU time rather than wall
 * time, so that time the process spends descheduled (other work on a shared machine) does
 * not count; the resolution (1 µs) is far below a batch's length.
 */
function cpuNow(): number {
  const usage = process.cpuUsage();
  return (usage.user + usage.system) * 1000;
}

/** Median ns per pick over timed batches, after a warm-up, with in-flight churn. */
function measurePicks(policy: Policy, endpoints: RouteEndpoint[], contexts: readonly PickContext[]): { ns: number; picks: number } {
  const window = new Array<RouteEndpoint | undefined>(endpoints.length * 2).fill(undefined);
  let slot = 0;
  let ctxIndex = 0;
  const step = (iterations: number) => {
    for (let i = 0; i < iterations; i++) {
      const ctx = contexts[ctxIndex];
      ctxIndex = ctxIndex + 1 === contexts.length ? 0 : ctxIndex + 1;
      const chosen = policy.pick(endpoints, ctx) as RouteEndpoint;
      chosen.inflight++;
      const released = window[slot];
      if (released !== undefined) released.inflight--;
      window[slot] = chosen;
      slot = slot + 1 === window.length ? 0 : slot + 1;
      sink ^= chosen.rank;
    }
  };
  // Warm up to a steady state: every endpoint has been chosen (prefix-aware allocates an
  // endpoint's index on its first pick) and the JIT has settled.
  step(Math.max(QUICK ? 2_000 : 10_000, endpoints.length * (QUICK ? 10 : 40)));
  const warmUntil = cpuNow() + WARM_MS * 1e6;
  while (cpuNow() < warmUntil) step(256);
  // Calibrate the batch size to about BATCH_MS.
  let iterations = 64;
  for (;;) {
    const start = cpuNow();
    step(iterations);
    const ms = (cpuNow() - start) / 1e6;
    if (ms >= BATCH_MS / 4) {
      iterations = Math.max(1, Math.round((iterations * BATCH_MS) / ms));
      break;
    }
    iterations *= 4;
  }
  const samples: number[] = [];
  let picks = 0;
  for (let batch = 0; batch < BATCHES; batch++) {
    const start = cpuNow();
    step(iterations);
    samples.push((cpuNow() - start) / iterations);
    picks += iterations;
  }
  for (const endpoint of endpoints) endpoint.inflight = 0;
  return { ns: median(samples), picks };
}

const plainContext: PickContext = { path: '/v1/completions', affinityKey: undefined, prompt: undefined };
const sessionContexts: PickContext[] = Array.from({ length: 1024 }, (_, i) => ({
  path: '/v1/chat/completions',
  affinityKey: `session-${i.toString(36)}-${(i * 2654435761) >>> 0}`,
  prompt: undefined,
}));

function headerPolicies(): Array<[string, () => Policy, readonly PickContext[]]> {
  const constant: () => Policy = () => ({ name: 'harness', pick: (candidates) => candidates[0] });
  return [
    ['harness (constant pick)', constant, [plainContext]],
    ['least-outstanding', leastOutstanding, [plainContext]],
    ['round-robin', roundRobin, [plainContext]],
    ['random', random, [plainContext]],
    ['power-of-two', powerOfTwo, [plainContext]],
    ['session-affinity', sessionAffinity, sessionContexts],
  ];
}

/** Streams each rank's latency model learns from before the SLO cells are timed (three sources, as the model's median needs). */
const SLO_SAMPLES_PER_RANK = 24;

/**
 * Pick contexts for the prefix-aware pick steered by SLO routing: one router's `SloRouting`,
 * its model warm on every endpoint (first tokens and streams at loads 1–12, their prefill
 * included), a stream with an objective decoding on every other rank (so that the choice checks
 * what it would break there), and a ticket per prompt, every other one with the bench's
 * interactive objectives (TTFT 300 ms, TPOT 64 ms), the rest without.
 */
function sloContexts(prompts: readonly string[], endpoints: readonly RouteEndpoint[]): Array<PickContext & { readonly slo: SloTicket }> {
  const routing = new SloRouting(parseSlo('slo', { trust: true }, 'prefix-aware')!, createSloMetrics(undefined));
  const { model } = routing;
  for (const [at, endpoint] of endpoints.entries()) {
    const rank = model.rank(endpoint.key);
    for (let i = 0; i < SLO_SAMPLES_PER_RANK; i++) {
      const source = `tenant-${i % 3}`;
      const load = 1 + (i % 12);
      model.learnTtft(rank, source, model.weigh(source), 20 + (i % 5) * 10, load, 0.05 + 0.002 * (20 + (i % 5) * 10) + 0.004 * load);
      model.learnTpot(rank, source, model.weigh(source), load, (i % 4) * 0.5, 0.04 + 0.002 * load + 0.0047 * (i % 4) * 0.5);
    }
    if (at % 2 === 0) rank.decoding(0.064, +1);
  }
  const objectives = { 'x-slo-ttft-ms': '300', 'x-slo-tpot-ms': '64' };
  return prompts.map((prompt, i) => ({
    path: '/v1/completions',
    affinityKey: undefined,
    prompt,
    slo: routing.ticket(i % 2 === 0 ? { ...objectives } : {}, true),
  }));
}

function measureBodyCost(size: number): { parseNs: number; extractNs: number } {
  const prompts = makePrompts(size, 16);
  const bodies = prompts.map((prompt, i) => Buffer.from(JSON.stringify({ model: 'bench', max_tokens: 16, user: `u${i}`, prompt })));
  const time = (fn: (i: number) => void) => {
    for (let i = 0; i < 200; i++) fn(i);
    const samples: number[] = [];
    const n = Math.max(20, Math.round((BATCH_MS * 1e6) / (size * 4)));
    for (let batch = 0; batch < BATCHES; batch++) {
      const start = cpuNow();
      for (let i = 0; i < n; i++) fn(i);
      samples.push((cpuNow() - start) / n);
    }
    return median(samples);
  };
  const parseNs = time((i) => {
    sink ^= (JSON.parse(bodies[i % bodies.length].toString('utf8')) as { max_tokens: number }).max_tokens;
  });
  const parsed = bodies.map((body) => JSON.parse(body.toString('utf8')) as unknown);
  const extractNs = time((i) => {
    sink ^= extractPrompt(parsed[i % parsed.length])?.length ?? 0;
  });
  return { parseNs, extractNs };
}

/** The rank handler's whole synchronous work for one header-only request, with fake req/res. */
function measureHandler(policy: 'least-outstanding' | 'round-robin', metrics: boolean): number {
  const services = new RouterServices(
    parseOptions({
      upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 8, ranks: [0, 2, 4, 6] }],
      policy,
      metrics: metrics ? { registry: new Registry() } : false,
    }, 'dpRank'),
  );
  const lifecycle = new RequestLifecycle(services, { proceed: (_req, _res, next) => next(), close: () => undefined });
  const res = new EventEmitter() as unknown as ServerResponse & EventEmitter;
  (res as { destroyed: boolean }).destroyed = false;
  let done = 0;
  const next = () => {
    done++;
  };
  const one = () => {
    const req = {
      method: 'POST',
      url: '/v1/completions',
      originalUrl: '/v1/completions',
      headers: { host: '127.0.0.1:30000', 'content-type': 'application/json', 'content-length': '256' },
      rawHeaders: ['Host', '127.0.0.1:30000', 'Content-Type', 'application/json', 'Content-Length', '256'],
      // Its body has arrived (no `timeouts.bodyMs` deadline to arm: this fake has no events).
      complete: true,
    } as unknown as RoutedRequest & IncomingMessage;
    lifecycle.handle(req, res, next);
    res.emit('close');
    // A real response is used once; this one is reused, so its listeners must not pile up.
    res.removeAllListeners('close');
  };
  for (let i = 0; i < 20_000; i++) one();
  const samples: number[] = [];
  const n = 50_000;
  for (let batch = 0; batch < BATCHES; batch++) {
    const start = cpuNow();
    for (let i = 0; i < n; i++) one();
    samples.push((cpuNow() - start) / n);
  }
  void services.close();
  if (done === 0) throw new Error('the handler never dispatched');
  return median(samples);
}

function main(): void {
  const cells: Cell[] = [];
  for (const count of ENDPOINT_COUNTS) {
    for (const [name, make, contexts] of headerPolicies()) {
      const { ns, picks } = measurePicks(make(), makeEndpoints(count), contexts);
      cells.push({ policy: name, endpoints: count, nsPerPick: ns, picks });
    }
  }
  for (const size of PROMPT_SIZES) {
    const prompts = makePrompts(size, 256);
    const contexts = prompts.map((prompt) => ({ path: '/v1/completions', affinityKey: undefined, prompt }));
    for (const count of ENDPOINT_COUNTS) {
      const { ns, picks } = measurePicks(prefixAware(), makeEndpoints(count), contexts);
      cells.push({ policy: 'prefix-aware', endpoints: count, promptBytes: size, nsPerPick: ns, picks });
    }
  }
  // The SLO-steered pick on the middle prompt size, measured after the unsteered one of the same run.
  const sloPrompts = makePrompts(SLO_PROMPT_BYTES, 256);
  for (const count of ENDPOINT_COUNTS) {
    const endpoints = makeEndpoints(count);
    const contexts = sloContexts(sloPrompts, endpoints);
    const { ns, picks } = measurePicks(prefixAware(), endpoints, contexts);
    // A cold model predicts nothing and steers nothing: the cell would time the unsteered pick.
    const predicted = contexts.filter((ctx) => !Number.isNaN(ctx.slo.predictedTpot)).length;
    if (predicted < contexts.length) throw new Error(`bench:decide: ${contexts.length - predicted} of ${contexts.length} SLO-steered picks made no TPOT prediction`);
    cells.push({ policy: 'prefix-aware + slo', endpoints: count, promptBytes: SLO_PROMPT_BYTES, nsPerPick: ns, picks });
  }
  const bodyCosts = PROMPT_SIZES.map((size) => ({ bytes: size, ...measureBodyCost(size) }));
  const handler = [
    { policy: 'least-outstanding', metrics: true, ns: measureHandler('least-outstanding', true) },
    { policy: 'least-outstanding', metrics: false, ns: measureHandler('least-outstanding', false) },
  ];

  const pickCell = (policy: string, count: number, prompt?: number) =>
    cells.find((c) => c.policy === policy && c.endpoints === count && c.promptBytes === prompt)!;
  const size = (bytes: number) => `${bytes / 1024} KB`;
  const fmt = (ns: number) => (ns >= 10_000 ? `${fixed(ns / 1000, 1)} µs` : `${fixed(ns, 0)} ns`);

  const policies = headerPolicies().map(([name]) => name);
  let out = '# Decision benchmark\n\n';
  out += `Node ${process.version}; median of ${BATCHES} batches of ~${BATCH_MS} ms of CPU time (process.cpuUsage, so a busy machine's other work does not count); per pick, in-flight churn included (see the harness row).\n\n`;
  out += '## Policies without a prompt (ns per pick)\n\n';
  out += markdownTable(
    ['policy', ...ENDPOINT_COUNTS.map((n) => `${n} endpoints`)],
    policies.map((policy) => [policy, ...ENDPOINT_COUNTS.map((n) => fmt(pickCell(policy, n).nsPerPick))]),
  );
  out += '\n\n## prefix-aware (per pick, hashing the prompt included)\n\n';
  out += markdownTable(
    ['prompt', ...ENDPOINT_COUNTS.map((n) => `${n} endpoints`)],
    PROMPT_SIZES.map((bytes) => [size(bytes), ...ENDPOINT_COUNTS.map((n) => fmt(pickCell('prefix-aware', n, bytes).nsPerPick))]),
  );
  out += `\n\n## prefix-aware steered by SLO routing (${size(SLO_PROMPT_BYTES)} prompt, model warm, half the requests with objectives)\n\n`;
  out += markdownTable(
    ['', ...ENDPOINT_COUNTS.map((n) => `${n} endpoints`)],
    [
      ['prefix-aware', ...ENDPOINT_COUNTS.map((n) => fmt(pickCell('prefix-aware', n, SLO_PROMPT_BYTES).nsPerPick))],
      ['prefix-aware + slo', ...ENDPOINT_COUNTS.map((n) => fmt(pickCell('prefix-aware + slo', n, SLO_PROMPT_BYTES).nsPerPick))],
      ['ratio', ...ENDPOINT_COUNTS.map((n) => `${fixed(pickCell('prefix-aware + slo', n, SLO_PROMPT_BYTES).nsPerPick / pickCell('prefix-aware', n, SLO_PROMPT_BYTES).nsPerPick, 2)}×`)],
    ],
  );
  out += '\n\n## Before the pick: body work a prefix-aware request costs (per request)\n\n';
  out += markdownTable(
    ['prompt', 'JSON.parse(body)', 'extractPrompt(parsed)'],
    bodyCosts.map((c) => [size(c.bytes), fmt(c.parseNs), fmt(c.extractNs)]),
  );
  out += '\n\n## Rank handler, whole synchronous work per header-only request (fake req/res, 4 endpoints)\n\n';
  out += markdownTable(
    ['policy', 'metrics', 'per request'],
    handler.map((h) => [h.policy, h.metrics ? 'prom-client' : 'off', fmt(h.ns)]),
  );

  const targets: Array<{ name: string; pass: boolean; figure: string }> = [];
  for (const policy of ['least-outstanding', 'round-robin', 'random', 'power-of-two']) {
    const ns = pickCell(policy, 64).nsPerPick;
    targets.push({ name: `${policy} < 2 µs per pick at 64 endpoints`, pass: ns < 2000, figure: fmt(ns) });
  }
  for (const count of ENDPOINT_COUNTS) {
    const ns = pickCell('prefix-aware', count, 8192).nsPerPick;
    targets.push({ name: `prefix-aware < 20 µs per pick on an 8 KB prompt, ${count} endpoints`, pass: ns < 20_000, figure: fmt(ns) });
  }
  // Issue 27's bound on the decision cost of predicted time to first token.
  const issue27 = pickCell('prefix-aware', 64, 8192).nsPerPick;
  targets.push({ name: 'prefix-aware ≤ 30 µs per pick at 64 endpoints on an 8 KB prompt (issue 27)', pass: issue27 <= 30_000, figure: fmt(issue27) });
  // The same bound for the SLO-steered pick: it predicts every candidate, where the unsteered pick may stop early.
  const slo64 = pickCell('prefix-aware + slo', 64, SLO_PROMPT_BYTES).nsPerPick;
  targets.push({ name: 'prefix-aware + slo ≤ 30 µs per pick at 64 endpoints on an 8 KB prompt (issue 27\'s bound)', pass: slo64 <= 30_000, figure: fmt(slo64) });
  out += '\n\n## Targets\n\n';
  for (const target of targets) out += `${target.pass ? 'PASS' : 'MISS'} ${target.name}: ${target.figure}\n`;

  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  const outArg = args.get('out');
  const file = typeof outArg === 'string' ? resolve(outArg) : join(__dirname, 'results', `decide-${stamp}.json`);
  mkdirSync(join(file, '..'), { recursive: true });
  writeFileSync(
    file,
    `${JSON.stringify({ benchmark: 'decide', date: new Date().toISOString(), node: process.version, quick: QUICK, cells, bodyCosts, handler, targets }, null, 2)}\n`,
  );
  out += `\nJSON: ${file}\n`;
  process.stdout.write(out);
  if (sink === 0.5) process.stdout.write('\n');
}

main();
