/** The figures of `bench:slo`, from what the client measured and what the mock and the router counted. */
import { markdownTable, median, percent, quantileSorted } from '../lib/stats';
import type { Outcome } from './client';
import { histogramMedian, metricSum, type Fleet } from './fleet';

export type ContenderResult =
  | { name: string; missing: string }
  | {
      name: string;
      missing?: undefined;
      requests: number;
      failed: number;
      interactive: number;
      attainment: number;
      ttftMet: number;
      tpotMet: number;
      interactiveTtftP50: number;
      interactiveTtftP99: number;
      interactiveTpotP50: number;
      batchTtftP99: number;
      hitRate: number;
      /** Share of interactive requests served by a half-speed rank. */
      interactiveOnSlow: number;
      predictedShare: number;
      /** Median |predicted − measured TTFT| at the client, ms. */
      ttftErrorClientMs: number;
      /** Medians of the router's prediction-error histograms, ms. */
      ttftErrorRouterMs: number;
      tpotErrorRouterMs: number;
      /** Every request's outcome at the client (`--outcomes`: kept in the results file, for a look at where a run missed). */
      outcomes?: readonly Outcome[];
      /** Per rank: interactive and batch requests served, the interactive ones' attainment, the batch ones' TTFT p99. */
      perRank: Array<{ rank: number; speed: number; interactive: number; batch: number; attainment: number; batchTtftP99: number }>;
      /** Per {@link WINDOW_MS} of sent time, the warm-up's included: interactive requests sent and those that missed an objective. */
      byWindow: Array<{ fromS: number; interactive: number; missed: number }>;
    };

/**
 * The windows of sent time the misses are counted in: a run's misses gather in a few (its first
 * seconds, a burst of the seeded arrivals), and its attainment moves with where they fall.
 */
export const WINDOW_MS = 4000;

export interface Objectives {
  ttftMs: number;
  tpotMs: number;
}

const sorted = (values: number[]) => values.filter(Number.isFinite).sort((a, b) => a - b);

/** The figures of one contender's run; requests sent before `warmupMs` are left out. */
export async function summarize(name: string, fleet: Fleet, outcomes: readonly Outcome[], warmupMs: number, objectives: Objectives, speeds: readonly number[]): Promise<ContenderResult> {
  const counted = outcomes.filter((one) => one.sentAt >= warmupMs);
  const ok = counted.filter((one) => one.status === 200);
  const interactive = counted.filter((one) => one.kind === 'interactive');
  const ttftMet = (one: Outcome) => one.status === 200 && one.ttftMs <= objectives.ttftMs;
  const tpotMet = (one: Outcome) => one.status === 200 && (one.tokens < 2 || one.tpotMs <= objectives.tpotMs);
  const served = interactive.filter((one) => one.status === 200);
  const batch = ok.filter((one) => one.kind === 'batch');
  const predicted = ok.filter((one) => one.predictedTtftMs !== undefined);
  const stats = fleet.mock.stats().perRank;
  let prompt = 0;
  let cached = 0;
  for (const rank of Object.values(stats)) {
    prompt += rank.promptTokens;
    cached += rank.cachedTokens;
  }
  const router = fleet.router;
  return {
    name,
    requests: counted.length,
    failed: counted.length - ok.length,
    interactive: interactive.length,
    attainment: interactive.filter((one) => ttftMet(one) && tpotMet(one)).length / interactive.length,
    ttftMet: interactive.filter(ttftMet).length / interactive.length,
    tpotMet: interactive.filter(tpotMet).length / interactive.length,
    interactiveTtftP50: quantileSorted(sorted(served.map((one) => one.ttftMs)), 0.5),
    interactiveTtftP99: quantileSorted(sorted(served.map((one) => one.ttftMs)), 0.99),
    interactiveTpotP50: quantileSorted(sorted(served.map((one) => one.tpotMs)), 0.5),
    batchTtftP99: quantileSorted(sorted(batch.map((one) => one.ttftMs)), 0.99),
    hitRate: prompt === 0 ? NaN : cached / prompt,
    interactiveOnSlow: served.filter((one) => speeds[one.rank] !== undefined && speeds[one.rank] < 1).length / Math.max(1, served.length),
    predictedShare: predicted.length / Math.max(1, ok.length),
    ttftErrorClientMs: median(predicted.map((one) => Math.abs(one.ttftMs - one.predictedTtftMs!))),
    ttftErrorRouterMs: router ? (await histogramMedian(router, 'dp_router_latency_prediction_error_seconds', { kind: 'ttft' })) * 1000 : NaN,
    tpotErrorRouterMs: router ? (await histogramMedian(router, 'dp_router_latency_prediction_error_seconds', { kind: 'tpot' })) * 1000 : NaN,
    perRank: speeds.map((speed, rank) => {
      const mine = served.filter((one) => one.rank === rank);
      const itsBatch = batch.filter((one) => one.rank === rank);
      const attainment = mine.filter((one) => ttftMet(one) && tpotMet(one)).length / Math.max(1, mine.length);
      return { rank, speed, interactive: mine.length, batch: itsBatch.length, attainment, batchTtftP99: quantileSorted(sorted(itsBatch.map((one) => one.ttftMs)), 0.99) };
    }),
    byWindow: windows(outcomes, (one) => ttftMet(one) && tpotMet(one)),
  };
}

function windows(outcomes: readonly Outcome[], met: (one: Outcome) => boolean): Array<{ fromS: number; interactive: number; missed: number }> {
  const out: Array<{ fromS: number; interactive: number; missed: number }> = [];
  for (const one of outcomes) {
    if (one.kind !== 'interactive') continue;
    const at = Math.floor(one.sentAt / WINDOW_MS);
    while (out.length <= at) out.push({ fromS: (out.length * WINDOW_MS) / 1000, interactive: 0, missed: 0 });
    out[at].interactive++;
    if (!met(one)) out[at].missed++;
  }
  return out;
}

/** Per contender, the interactive requests that missed of those sent, per window of sent time (the first tenth is not counted in the attainment). */
export function formatWindows(results: readonly ContenderResult[]): string {
  const present = results.flatMap((one) => (one.missing === undefined ? [one] : []));
  const count = Math.max(0, ...present.map((one) => one.byWindow.length));
  const heads = Array.from({ length: count }, (_, at) => `${(at * WINDOW_MS) / 1000} s`);
  const rows = present.map((one) => [one.name, ...Array.from({ length: count }, (_, at) => (one.byWindow[at] === undefined ? '' : `${one.byWindow[at].missed}/${one.byWindow[at].interactive}`))]);
  return markdownTable(['interactive missed/sent, by sent time', ...heads], rows);
}

/** Per contender, each rank's share of the interactive and of the batch requests, its interactive attainment and its batch TTFT p99. */
export function formatPerRank(results: readonly ContenderResult[]): string {
  const present = results.filter((one) => one.missing === undefined);
  const rows = present.flatMap((one) =>
    one.missing !== undefined
      ? []
      : [[one.name, ...one.perRank.map((rank) => `${rank.interactive}/${rank.batch} ${share(rank.attainment)} ${rank.batch > 0 ? ms(rank.batchTtftP99) : '—'}`)]],
  );
  const speeds = present[0]?.missing === undefined ? present[0].perRank.map((rank) => `rank ${rank.rank} (×${rank.speed})`) : [];
  return markdownTable(['interactive/batch, attainment, batch TTFT p99', ...speeds], rows);
}

const ms = (value: number) => (Number.isFinite(value) ? `${Math.round(value)} ms` : 'n/a');
const share = (value: number) => (Number.isFinite(value) ? percent(value) : 'n/a');

/** One seed's arrivals and what each contender made of them. */
export interface SeedResults {
  readonly seed: number;
  readonly results: readonly ContenderResult[];
}

/** Per contender, each seed's attainment and batch TTFT p99, and their means (the figures to compare rules by). */
export function formatSeeds(bySeed: readonly SeedResults[]): string {
  const names = bySeed[0].results.map((one) => one.name);
  const rows = names.map((name) => {
    const runs = bySeed.map(({ results }) => results.find((one) => one.name === name));
    const measured = runs.filter((one): one is Extract<ContenderResult, { missing?: undefined }> => one !== undefined && one.missing === undefined);
    const cells = runs.map((one) => (one === undefined || one.missing !== undefined ? 'n/a' : `${share(one.attainment)} / ${ms(one.batchTtftP99)}`));
    const mean = (pick: (one: (typeof measured)[number]) => number) => measured.reduce((sum, one) => sum + pick(one), 0) / measured.length;
    return [name, ...cells, measured.length === 0 ? 'n/a' : `${share(mean((one) => one.attainment))} / ${ms(mean((one) => one.batchTtftP99))}`];
  });
  return markdownTable(['attainment / batch TTFT p99', ...bySeed.map(({ seed }) => `seed ${seed}`), 'mean'], rows);
}

export function formatSlo(results: readonly ContenderResult[]): string {
  const rows = results.map((one) =>
    one.missing !== undefined
      ? [one.name, `not present: ${one.missing.split('\n')[0].slice(0, 80)}`, '', '', '', '', '', '', '', '', '', '', '']
      : [
          one.name,
          share(one.attainment),
          share(one.ttftMet),
          share(one.tpotMet),
          ms(one.interactiveTtftP50),
          ms(one.interactiveTtftP99),
          ms(one.interactiveTpotP50),
          ms(one.batchTtftP99),
          share(one.hitRate),
          share(one.interactiveOnSlow),
          share(one.predictedShare),
          `${ms(one.ttftErrorClientMs)} / ${ms(one.ttftErrorRouterMs)}`,
          ms(one.tpotErrorRouterMs),
        ],
  );
  return markdownTable(
    ['contender', 'attainment', 'TTFT met', 'TPOT met', 'int. TTFT p50', 'int. TTFT p99', 'int. TPOT p50', 'batch TTFT p99', 'hit rate', 'int. on slow', 'predicted', 'TTFT err (client / router)', 'TPOT err'],
    rows,
  );
}

export type TierResult =
  | { name: string; version: string; workload: string; missing: string }
  | {
      name: string;
      version: string;
      workload: string;
      missing?: undefined;
      requests: number;
      failed: number;
      ttftP50: number;
      ttftP99: number;
      gpuHitRate: number;
      cpuHitRate: number;
      invalidEvents: number;
    };

export async function tierSummary(name: string, version: string, workload: string, fleet: Fleet, outcomes: readonly Outcome[], warmupMs: number): Promise<TierResult> {
  const counted = outcomes.filter((one) => one.sentAt >= warmupMs);
  const ok = counted.filter((one) => one.status === 200);
  const ttfts = sorted(ok.map((one) => one.ttftMs));
  let prompt = 0;
  let gpu = 0;
  let cpu = 0;
  for (const rank of Object.values(fleet.mock.stats().perRank)) {
    prompt += rank.promptTokens;
    gpu += rank.cachedTokens;
    cpu += rank.cpuCachedTokens ?? 0;
  }
  return {
    name,
    version,
    workload,
    requests: counted.length,
    failed: counted.length - ok.length,
    ttftP50: quantileSorted(ttfts, 0.5),
    ttftP99: quantileSorted(ttfts, 0.99),
    gpuHitRate: gpu / prompt,
    cpuHitRate: cpu / prompt,
    invalidEvents: fleet.router ? await metricSum(fleet.router, 'dp_router_kv_events_total', { type: 'invalid' }) : NaN,
  };
}

export function formatTiers(results: readonly TierResult[]): string {
  const today = new Map(results.flatMap((one) => (one.missing === undefined && one.name === 'exact (today)' ? [[`${one.version}/${one.workload}`, one] as const] : [])));
  /** A figure with its ratio to today's routing's on the same events and workload. */
  const against = (one: TierResult & { missing?: undefined }, value: number, of: (base: typeof one) => number) => {
    const base = today.get(`${one.version}/${one.workload}`);
    return base === undefined || base === one ? ms(value) : `${ms(value)} (${(value / of(base)).toFixed(2)}×)`;
  };
  const rows = results.map((one) =>
    one.missing !== undefined
      ? [one.version, one.workload, one.name, `not present: ${one.missing.split('\n')[0].slice(0, 80)}`, '', '', '', '', '']
      : [one.version, one.workload, one.name, against(one, one.ttftP50, (base) => base.ttftP50), against(one, one.ttftP99, (base) => base.ttftP99), share(one.gpuHitRate), share(one.cpuHitRate), String(one.invalidEvents), String(one.failed)],
  );
  return markdownTable(['events as', 'workload', 'contender', 'TTFT p50', 'TTFT p99', 'GPU hits', 'CPU hits', 'invalid events', 'failed'], rows);
}
