import type { RankModel } from './rank';
import type { RunMetrics } from './simulator';
import type { LOAD_LEVELS } from './workloads';

/** `small` is the CI smoke size (seconds); `full` is the published workload sizes. */
export type BenchSize = 'small' | 'full';

/** One policy on one workload: the high-load run's cache and balance figures, TTFT at both levels. */
export interface PolicyResult extends RunMetrics {
  policy: string;
  low: { ttftP50: number; ttftP99: number; hitRate: number };
}

export interface WorkloadResult {
  workload: string;
  description: string;
  requests: number;
  rankCacheBlocks: number;
  /** Arrival scale per level: seconds per unit of the workload's timing. */
  secondsPerUnit: { low: number; high: number };
  /** One unbounded cache shared by every rank: what any routing could reach at most. */
  fleetBoundHitRate: number;
  /** The high-load TTFT p99 no routing can beat (`ttft-floor.ts`); `null` where arrivals wait for answers. */
  ttftFloorP99High: number | null;
  results: PolicyResult[];
}

/** One routing target, checked against a run. */
export interface TargetResult {
  target: string;
  pass: boolean;
  measured: string;
}

/** What `npm run bench:routing` prints and writes to `routing-<size>.json`. */
export interface BenchReport {
  size: BenchSize;
  seed: number;
  ranks: number;
  model: RankModel;
  loadLevels: typeof LOAD_LEVELS;
  workloads: WorkloadResult[];
  targets: TargetResult[];
  elapsedSeconds: number;
}
