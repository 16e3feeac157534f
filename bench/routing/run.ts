import { join } from 'node:path';
import { leastOutstanding } from '../../lib/policies/least-outstanding';
import { powerOfTwo } from '../../lib/policies/power-of-two';
import { prefixAware } from '../../lib/policies/prefix-aware';
import { random } from '../../lib/policies/random';
import { roundRobin } from '../../lib/policies/round-robin';
import { sessionAffinity } from '../../lib/policies/session-affinity';
import { oracle, sglangCacheAware, vllmInternalBalancer } from './baselines';
import { type RankModel, SimRank } from './rank';
import type { BenchReport, BenchSize } from './results';
import { seededRng } from './rng';
import { type PolicyFactory, type RunMetrics, SimEndpoint, simulate } from './simulator';
import { evaluateTargets } from './targets';
import { ttftFloorP99 } from './ttft-floor';
import {
  type FleetCapacity,
  LOAD_LEVELS,
  mooncakeWorkload,
  multiTenantWorkload,
  multiTurnWorkload,
  sharedPrefixWorkload,
  type SimRequest,
  type Workload,
} from './workloads';

export interface BenchOptions {
  size?: BenchSize;
  seed?: number;
  /** A Mooncake-format JSONL trace; default: the committed generated fixture. */
  tracePath?: string;
  /** `prefix-aware`'s `placementSlack`; default: the policy's (4). 0 is what one gateway, or replicas with `peers` and KV events, should run. */
  placementSlack?: number;
}

export const RANKS = 8;

/** A prefill-bound engine: ~10 K prompt tokens/s, 100 output tokens/s per request, 32 slots. */
export const RANK_MODEL: RankModel = {
  prefillTokensPerSecond: 10_000,
  prefillOverheadSeconds: 0.005,
  decodeSecondsPerToken: 0.01,
  runningSlots: 32,
};

export const DEFAULT_TRACE = join(__dirname, 'fixtures', 'mooncake-sample.jsonl');

/** Characters per token in the simulated prompt text. */
const CHARS_PER_TOKEN = 4;

/** Every policy in the comparison, in table order. The library's own are the real objects. */
export const POLICIES: ReadonlyArray<{ name: string; make: PolicyFactory }> = [
  { name: 'round-robin', make: () => roundRobin() },
  { name: 'random', make: ({ rng }) => random(rng) },
  { name: 'least-outstanding', make: () => leastOutstanding() },
  { name: 'power-of-two', make: ({ rng }) => powerOfTwo(rng) },
  { name: 'session-affinity', make: () => sessionAffinity() },
  {
    name: 'prefix-aware',
    // Defaults, except the memory bound, sized to the rank's KV cache as its JSDoc advises.
    make: ({ workload, placementSlack }) => prefixAware({ maxBlocksPerEndpoint: (workload.rankCacheBlocks * 16 * CHARS_PER_TOKEN) / 64, placementSlack }),
  },
  { name: 'vllm-internal', make: ({ view }) => vllmInternalBalancer(view) },
  { name: 'sglang-cache-aware', make: ({ view }) => sglangCacheAware(view) },
  { name: 'oracle', make: ({ view }) => oracle(view) },
];

export function buildWorkloads(size: BenchSize, seed: number, tracePath: string): Workload[] {
  const capacity: FleetCapacity = { ranks: RANKS, prefillTokensPerSecond: RANK_MODEL.prefillTokensPerSecond };
  const small = size === 'small';
  return [
    sharedPrefixWorkload(seededRng(seed), capacity, {
      groups: small ? 16 : 64,
      promptsPerGroup: 16,
      systemTokens: 2048,
      questionTokens: 128,
      outputTokens: 256,
    }),
    multiTurnWorkload(seededRng(seed + 1), capacity, {
      conversations: 24,
      minTurns: small ? 6 : 12,
      maxTurns: small ? 9 : 18,
      commonPrefixTokens: 500,
    }),
    mooncakeWorkload(tracePath, capacity, small ? 150 : Infinity),
    multiTenantWorkload(seededRng(seed + 2), capacity, {
      tenants: small ? 32 : 96,
      requests: small ? 256 : 768,
      systemTokens: 1024,
      questionTokens: 128,
      outputTokens: 128,
      zipf: 1.1,
    }),
  ];
}

export function runOnce(workload: Workload, secondsPerUnit: number, make: PolicyFactory, seed: number, placementSlack?: number): RunMetrics {
  const ranks = Array.from({ length: RANKS }, (_, i) => new SimRank(i, workload.rankCacheBlocks));
  const endpoints = ranks.map((rank) => new SimEndpoint(rank.index));
  let current: SimRequest | undefined;
  let clock = 0;
  const policy = make({
    view: { rankOf: (endpoint) => ranks[endpoint.rank], current: () => current as SimRequest, now: () => clock },
    rng: seededRng(seed),
    workload,
    placementSlack,
  });
  return simulate(workload, secondsPerUnit, [{ policy, endpoints }], ranks, RANK_MODEL, (request, now) => {
    current = request;
    clock = now;
  });
}

/** The best hit rate any routing could reach: every prompt finds every block an earlier request sent. */
export function fleetBound(workload: Workload): number {
  const seen = new Set<number>();
  let hits = 0;
  let total = 0;
  for (const request of workload.requests) {
    let run = 0;
    while (run < request.inputBlocks.length && seen.has(request.inputBlocks[run])) run++;
    hits += run * 16;
    total += request.inputTokens;
    for (const block of request.sequenceBlocks) seen.add(block);
  }
  return hits / total;
}

/** Runs every policy on every workload at both load levels; deterministic for a seed. */
export function runRoutingBenchmark(options: BenchOptions = {}): BenchReport {
  const started = process.hrtime.bigint();
  const size = options.size ?? 'full';
  const seed = options.seed ?? 42;
  const workloads = buildWorkloads(size, seed, options.tracePath ?? DEFAULT_TRACE).map((workload) => {
    const results = POLICIES.map(({ name, make }, index) => {
      const high = runOnce(workload, workload.timeScale.high, make, seed * 1000 + index, options.placementSlack);
      const low = runOnce(workload, workload.timeScale.low, make, seed * 1000 + index, options.placementSlack);
      return { policy: name, ...high, low: { ttftP50: low.ttftP50, ttftP99: low.ttftP99, hitRate: low.hitRate } };
    });
    return {
      workload: workload.name,
      description: workload.description,
      requests: workload.requests.length,
      rankCacheBlocks: workload.rankCacheBlocks,
      secondsPerUnit: { ...workload.timeScale },
      fleetBoundHitRate: fleetBound(workload),
      ttftFloorP99High: ttftFloorP99(workload, workload.timeScale.high, RANK_MODEL),
      results,
    };
  });
  return {
    size,
    seed,
    ranks: RANKS,
    model: RANK_MODEL,
    loadLevels: LOAD_LEVELS,
    workloads,
    targets: evaluateTargets(workloads),
    elapsedSeconds: Number(process.hrtime.bigint() - started) / 1e9,
  };
}
