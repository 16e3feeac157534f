import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { runBench } from './cli';

/** Every policy in the simulator's comparison, in table order. */
const POLICIES = [
  'round-robin',
  'random',
  'least-outstanding',
  'power-of-two',
  'session-affinity',
  'prefix-aware',
  'vllm-internal',
  'sglang-cache-aware',
  'oracle',
];

interface Result {
  policy: string;
  completed: number;
  hitRate: number;
  unboundedHitRate: number;
  maxOverMean: number;
  cov: number;
  sameRankRate: number | null;
  ttftP50: number;
  ttftP99: number;
  low: { ttftP50: number; ttftP99: number };
}

interface Report {
  ranks: number;
  workloads: Array<{ workload: string; requests: number; fleetBoundHitRate: number; ttftFloorP99High: number | null; results: Result[] }>;
  targets: Array<{ target: string; pass: boolean; measured: string }>;
}

/** `npm run bench:routing -- --size small --seed 42 --out DIR [extra…]`, read back from the JSON it writes. */
async function runSimulator(dir: string, extra: readonly string[] = []): Promise<Report> {
  const run = await runBench('bench/routing/main.ts', ['--size', 'small', '--seed', '42', '--out', dir, ...extra], 60_000);
  if (run.code !== 0) throw new Error(`bench:routing exited with ${run.code}\n${run.stderr}`);
  return JSON.parse(readFileSync(join(dir, 'routing-small.json'), 'utf8')) as Report;
}

describe('routing simulator (small)', () => {
  const dirs = [0, 1, 2].map(() => mkdtempSync(join(tmpdir(), 'dp-router-routing-')));
  let report: Report;
  let again: Report;
  /** The same run with `--placement-slack 0`. */
  let tight: Report;

  beforeAll(async () => {
    [report, again, tight] = await Promise.all([runSimulator(dirs[0]), runSimulator(dirs[1]), runSimulator(dirs[2], ['--placement-slack', '0'])]);
  }, 90_000);

  afterAll(() => {
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  it("--placement-slack changes prefix-aware's placement and nothing else", () => {
    const row = (run: Report, workload: string, policy: string) => run.workloads.find((w) => w.workload === workload)!.results.find((r) => r.policy === policy)!;
    for (const { workload, results } of report.workloads) {
      for (const { policy } of results) if (policy !== 'prefix-aware') expect(row(tight, workload, policy)).toEqual(row(report, workload, policy));
    }
    // New prefixes go to the shortest queue: shared-prefix's tail under load is shorter.
    expect(row(tight, 'shared-prefix', 'prefix-aware').ttftP99).toBeLessThan(row(report, 'shared-prefix', 'prefix-aware').ttftP99);
  });

  it("gives each open-loop workload a TTFT floor no policy beats, the oracle's and SGLang's included", () => {
    for (const run of [report, tight]) {
      for (const { workload, ttftFloorP99High: floor, results } of run.workloads) {
        if (workload === 'multi-turn') {
          // Its turns wait for earlier answers: their arrivals depend on the routing.
          expect(floor).toBeNull();
          continue;
        }
        expect(floor).toBeGreaterThan(0);
        for (const result of results) expect(result.ttftP99).toBeGreaterThanOrEqual(floor!);
      }
    }
  });

  it('is deterministic for a seed', () => {
    expect(again.workloads).toEqual(report.workloads);
  });

  it('reports every policy on every workload with sane numbers', () => {
    expect(report.workloads.map((w) => w.workload)).toEqual(['shared-prefix', 'multi-turn', 'mooncake', 'multi-tenant']);
    for (const workload of report.workloads) {
      expect(workload.results.map((r) => r.policy)).toEqual(POLICIES);
      for (const r of workload.results) {
        expect(r.completed).toBe(workload.requests);
        expect(r.hitRate).toBeGreaterThanOrEqual(0);
        expect(r.hitRate).toBeLessThanOrEqual(r.unboundedHitRate + 1e-9);
        expect(r.unboundedHitRate).toBeLessThanOrEqual(workload.fleetBoundHitRate + 1e-9);
        expect(r.maxOverMean).toBeGreaterThanOrEqual(1);
        expect(r.maxOverMean).toBeLessThanOrEqual(report.ranks);
        expect(r.cov).toBeGreaterThanOrEqual(0);
        expect(r.ttftP50).toBeGreaterThan(0);
        expect(r.ttftP99).toBeGreaterThanOrEqual(r.ttftP50);
        expect(r.low.ttftP99).toBeGreaterThanOrEqual(r.low.ttftP50);
        if (workload.workload === 'multi-turn') expect(r.sameRankRate).not.toBeNull();
        else expect(r.sameRankRate).toBeNull();
      }
    }
    const roundRobin = report.workloads[0].results.find((r) => r.policy === 'round-robin');
    expect(roundRobin?.maxOverMean).toBeCloseTo(1, 5);
  });

  it.each([
    'shared-prefix: prefix-aware hit rate ≥ 3.8× round-robin',
    'shared-prefix: prefix-aware hit rate ≥ 0.9× oracle',
    'shared-prefix: prefix-aware max/mean load ≤ 1.25',
    'multi-turn: prefix-aware TTFT p99 under load ≤ 0.5× round-robin',
    'multi-turn: prefix-aware TTFT p99 at low load ≤ least-outstanding',
    'multi-turn: session-affinity TTFT p99 under load ≤ 0.5× round-robin',
    'multi-turn: session-affinity TTFT p99 at low load ≤ least-outstanding',
    'mooncake: prefix-aware TTFT p99 at low load ≤ least-outstanding',
    'multi-turn: prefix-aware beats sglang-cache-aware (hit rate no lower, max/mean no higher)',
  ])('meets the target: %s', (name) => {
    const target = report.targets.find((t) => t.target === name);
    expect(target).toBeDefined();
    expect(`${target?.pass ? 'PASS' : 'MISS'} ${target?.measured}`).toMatch(/^PASS/);
  });
});
