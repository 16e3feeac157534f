import { describe, expect, it } from '@jest/globals';
import { POLICIES, runRoutingBenchmark } from '../../bench/routing/run';

describe('routing simulator (small)', () => {
  const report = runRoutingBenchmark({ size: 'small', seed: 42 });

  it('is deterministic for a seed', () => {
    const again = runRoutingBenchmark({ size: 'small', seed: 42 });
    expect(again.workloads).toEqual(report.workloads);
  });

  it('reports every policy on every workload with sane numbers', () => {
    expect(report.workloads.map((w) => w.workload)).toEqual(['shared-prefix', 'multi-turn', 'mooncake']);
    for (const workload of report.workloads) {
      expect(workload.results.map((r) => r.policy)).toEqual(POLICIES.map((p) => p.name));
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
    'multi-turn: prefix-aware beats sglang-cache-aware (higher hit rate, max/mean no higher)',
  ])('meets the target: %s', (name) => {
    const target = report.targets.find((t) => t.target === name);
    expect(target).toBeDefined();
    expect(`${target?.pass ? 'PASS' : 'MISS'} ${target?.measured}`).toMatch(/^PASS/);
  });
});
