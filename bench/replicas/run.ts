import { prefixAware } from '../../lib/policies/prefix-aware';
import { roundRobin } from '../../lib/policies/round-robin';
import type { Policy } from '../../lib/types';
import { oracle } from '../routing/baselines';
import { SimRank } from '../routing/rank';
import { fleetBound, RANK_MODEL, RANKS } from '../routing/run';
import { type SimGateway, SimEndpoint, type SimView, simulate } from '../routing/simulator';
import { TOKENS_PER_BLOCK, tokensText } from '../routing/tokens';
import { seededRng, shuffle } from '../routing/rng';
import { buildRequest, rankCacheFor, type SimRequest, TokenSource, type Workload } from '../routing/workloads';
import { type EventedPrefixCache, exactFromEvents, publishEvents } from './exact';
import { percent, signed } from '../lib/stats';

/** `small` is the CI smoke size (about a second); `full` is the workload. */
export type ReplicasSize = 'small' | 'full';

/** The workload: groups of prompts sharing a system prompt, sent by a fixed number of clients. */
export interface ReplicasShape {
  groups: number;
  promptsPerGroup: number;
  systemTokens: number;
  questionTokens: number;
  outputTokens: number;
  /** Clients, each sending its next prompt when its last one is answered. */
  concurrency: number;
}

/** The operator test: 32 groups × 16 prompts, 2,000-character system prompts, 8 clients. */
export const FULL_SHAPE: ReplicasShape = {
  groups: 32,
  promptsPerGroup: 16,
  systemTokens: 500,
  questionTokens: 64,
  outputTokens: 128,
  concurrency: 8,
};

const SMALL_SHAPE: ReplicasShape = { ...FULL_SHAPE, groups: 12, promptsPerGroup: 12 };

/** Gateway replicas compared: 1, 2 and 3, as behind a Kubernetes Service. */
export const REPLICA_COUNTS = [1, 2, 3] as const;

/** The caches compared: every rank's share of the distinct prompt blocks, and half that. */
export const CACHE_SIZES = [
  { name: 'fits', fraction: 1 },
  { name: 'pressure', fraction: 0.5 },
] as const;

/** Characters per token in the simulated prompt text (as bench:routing). */
const CHARS_PER_TOKEN = 4;

/** `maxBlocksPerEndpoint` sized to the rank's KV cache, as prefix-aware's JSDoc advises. */
export function indexBlocksFor(rankCacheBlocks: number): number {
  return (rankCacheBlocks * TOKENS_PER_BLOCK * CHARS_PER_TOKEN) / 64;
}

/**
 * Builds one gateway replica's policy; `replica` numbers the replicas of one run from 0;
 * `caches` are the ranks' caches, which publish KV events to their listeners.
 */
export type ContenderFactory = (setup: { view: SimView; replica: number; rankCacheBlocks: number; caches: readonly EventedPrefixCache[] }) => Policy;

/** The contender routing on KV events. */
const EXACT = 'exact (KV events)';

/**
 * The policies compared, in table order. Each replica gets its own instance and learns only
 * from its own traffic; the caches (and so `exact` and `oracle`'s knowledge) are the fleet's.
 */
export const CONTENDERS: ReadonlyArray<{ name: string; make: ContenderFactory }> = [
  { name: 'round-robin', make: () => roundRobin() },
  {
    name: 'approximate',
    // Defaults, except the memory bound.
    make: ({ rankCacheBlocks }) => prefixAware({ maxBlocksPerEndpoint: indexBlocksFor(rankCacheBlocks) }),
  },
  // Each replica's own lib/kv-events index, fed every rank's KV events, scored by prefix-aware
  // (see exact.ts); the approximate index's memory bound as above, for its fallback.
  {
    name: EXACT,
    make: ({ view, caches, rankCacheBlocks }) => exactFromEvents(view, caches, { maxBlocksPerEndpoint: indexBlocksFor(rankCacheBlocks) }),
  },
  { name: 'oracle', make: ({ view }) => oracle(view) },
];

/** One cell: a contender with some replicas on some cache size. */
export interface ReplicasResult {
  policy: string;
  replicas: number;
  cache: (typeof CACHE_SIZES)[number]['name'];
  rankCacheBlocks: number;
  hitRate: number;
  ttftP50: number;
  ttftP99: number;
  maxOverMean: number;
  completed: number;
}

/** A target, checked against a run. */
export interface ReplicasTarget {
  target: string;
  pass: boolean;
  measured: string;
}

/** What `npm run bench:replicas` prints and writes to `replicas-<size>.json`. */
export interface ReplicasReport {
  size: ReplicasSize;
  seed: number;
  ranks: number;
  shape: ReplicasShape;
  requests: number;
  results: ReplicasResult[];
  targets: ReplicasTarget[];
  /** The best hit rate any routing could reach on the workload (`bench:routing`'s fleet bound). */
  ceilingHitRate: number;
  elapsedSeconds: number;
}

/**
 * Closed loop: the prompts, shuffled, are split among `concurrency` clients; a client sends
 * its next prompt as soon as its last one is answered.
 */
export function closedLoopWorkload(seed: number, shape: ReplicasShape): Workload {
  const rng = seededRng(seed);
  const tokens = new TokenSource();
  const prompts: number[][] = [];
  for (let group = 0; group < shape.groups; group++) {
    const system = tokens.take(shape.systemTokens);
    for (let i = 0; i < shape.promptsPerGroup; i++) prompts.push(system.concat(tokens.take(shape.questionTokens)));
  }
  shuffle(rng, prompts);
  const requests: SimRequest[] = prompts.map((input, id) =>
    buildRequest(id, {
      unitArrival: 0,
      follows: id >= shape.concurrency ? id - shape.concurrency : undefined,
      input,
      output: shape.outputTokens,
      prompt: tokensText(input),
      path: '/v1/completions',
    }),
  );
  return {
    name: 'replicas',
    description: `${shape.groups} groups × ${shape.promptsPerGroup} prompts, ${shape.systemTokens * CHARS_PER_TOKEN}-character system prompt, concurrency ${shape.concurrency}`,
    requests,
    timeScale: { low: 1, high: 1 },
    rankCacheBlocks: rankCacheFor(requests, RANKS),
  };
}

function runCell(workload: Workload, rankCacheBlocks: number, replicas: number, make: ContenderFactory): Omit<ReplicasResult, 'policy' | 'cache'> {
  const ranks = Array.from({ length: RANKS }, (_, i) => new SimRank(i, rankCacheBlocks));
  const caches = publishEvents(ranks, rankCacheBlocks);
  let current: SimRequest | undefined;
  let clock = 0;
  const view: SimView = { rankOf: (endpoint) => ranks[(endpoint as SimEndpoint).rank], current: () => current as SimRequest, now: () => clock };
  const gateways: SimGateway[] = Array.from({ length: replicas }, (_, replica) => ({
    policy: make({ view, replica, rankCacheBlocks, caches }),
    endpoints: ranks.map((rank) => new SimEndpoint(rank.index)),
  }));
  const metrics = simulate(workload, 1, gateways, ranks, RANK_MODEL, (request, now) => {
    current = request;
    clock = now;
  });
  return {
    replicas,
    rankCacheBlocks,
    hitRate: metrics.hitRate,
    ttftP50: metrics.ttftP50,
    ttftP99: metrics.ttftP99,
    maxOverMean: metrics.maxOverMean,
    completed: metrics.completed,
  };
}

/** Options of {@link runReplicasBenchmark}. */
export interface ReplicasOptions {
  size?: ReplicasSize;
  seed?: number;
  /** More contenders, run after `approximate` (e.g. another version of the policy). */
  extra?: ReadonlyArray<{ name: string; make: ContenderFactory }>;
}

/** Every contender × replica count × cache size; deterministic for a seed. */
export function runReplicasBenchmark(options: ReplicasOptions = {}): ReplicasReport {
  const started = process.hrtime.bigint();
  const size = options.size ?? 'full';
  const seed = options.seed ?? 42;
  const shape = size === 'small' ? SMALL_SHAPE : FULL_SHAPE;
  const workload = closedLoopWorkload(seed, shape);
  const ceiling = fleetBound(workload);
  const results: ReplicasResult[] = [];
  for (const cache of CACHE_SIZES) {
    const rankCacheBlocks = Math.ceil(workload.rankCacheBlocks * cache.fraction);
    const contenders = [...CONTENDERS];
    contenders.splice(2, 0, ...(options.extra ?? []));
    for (const { name, make } of contenders) {
      for (const replicas of REPLICA_COUNTS) {
        results.push({ policy: name, cache: cache.name, ...runCell(workload, rankCacheBlocks, replicas, make) });
      }
    }
  }
  return {
    size,
    seed,
    ranks: RANKS,
    shape,
    requests: workload.requests.length,
    results,
    targets: evaluateTargets(results, ceiling),
    ceilingHitRate: ceiling,
    elapsedSeconds: Number(process.hrtime.bigint() - started) / 1e9,
  };
}

/**
 * The targets: without events, three replicas keep 0.85 of one replica's hit rate;
 * with events, 0.95, and one replica under pressure beats approximate by 5 points.
 */
function evaluateTargets(results: readonly ReplicasResult[], ceiling: number): ReplicasTarget[] {
  const hit = (policy: string, cache: string, replicas: number) =>
    results.find((r) => r.policy === policy && r.cache === cache && r.replicas === replicas)?.hitRate ?? NaN;
  const ratio = (policy: string, share: number) =>
    CACHE_SIZES.map(({ name }) => {
      const one = hit(policy, name, 1);
      const three = hit(policy, name, 3);
      return {
        target: `cache ${name}: ${policy} with 3 replicas ≥ ${share}× ${policy} with 1 replica`,
        pass: three >= share * one,
        measured: `${three.toFixed(3)} vs ${one.toFixed(3)} (${(three / one).toFixed(2)}×)`,
      };
    });
  const exact = hit(EXACT, 'pressure', 1);
  const approximate = hit('approximate', 'pressure', 1);
  const oracle = hit('oracle', 'pressure', 1);
  return [
    ...ratio('approximate', 0.85),
    ...ratio(EXACT, 0.95),
    {
      target: `cache pressure: ${EXACT} with 1 replica ≥ approximate + 5 points`,
      pass: exact >= approximate + 0.05,
      measured: `${percent(exact)} vs ${percent(approximate)} (${signed((exact - approximate) * 100, 1)} points; oracle ${percent(oracle)}, ceiling ${percent(ceiling)})`,
    },
  ];
}

