import type { PolicyResult, TargetResult, WorkloadResult } from './results';

const f2 = (x: number): string => x.toFixed(2);
const f3 = (x: number): string => x.toFixed(3);
const ms = (seconds: number): string => `${(seconds * 1000).toFixed(0)} ms`;

/** Where half of round-robin's p99 is below what any routing can reach (`ttft-floor.ts`), says so. */
function floorNote(workload: WorkloadResult, roundRobinP99: number): string {
  const floor = workload.ttftFloorP99High;
  return floor !== null && floor > 0.5 * roundRobinP99 ? `; out of reach: any routing ≥ ${ms(floor)}` : '';
}

function result(workload: WorkloadResult | undefined, policy: string): PolicyResult | undefined {
  return workload?.results.find((r) => r.policy === policy);
}

/** Checks the routing targets (8 ranks, one run) against the measured figures. */
export function evaluateTargets(workloads: readonly WorkloadResult[]): TargetResult[] {
  const targets: TargetResult[] = [];
  const byName = (name: string) => workloads.find((w) => w.workload === name);
  const shared = byName('shared-prefix');
  const multi = byName('multi-turn');

  const pa = result(shared, 'prefix-aware');
  const rr = result(shared, 'round-robin');
  const best = result(shared, 'oracle');
  if (pa && rr && best) {
    targets.push({
      target: 'shared-prefix: prefix-aware hit rate ≥ 3.8× round-robin',
      pass: pa.hitRate >= 3.8 * rr.hitRate,
      measured: `${f3(pa.hitRate)} vs ${f3(rr.hitRate)} (${f2(pa.hitRate / rr.hitRate)}×)`,
    });
    targets.push({
      target: 'shared-prefix: prefix-aware hit rate ≥ 0.9× oracle',
      pass: pa.hitRate >= 0.9 * best.hitRate,
      measured: `${f3(pa.hitRate)} vs ${f3(best.hitRate)} (${f2(pa.hitRate / best.hitRate)}×)`,
    });
    targets.push({
      target: 'shared-prefix: prefix-aware max/mean load ≤ 1.25',
      pass: pa.maxOverMean <= 1.25,
      measured: f3(pa.maxOverMean),
    });
  }

  for (const policy of ['session-affinity', 'prefix-aware']) {
    const r = result(multi, policy);
    if (!r || r.sameRankRate === null) continue;
    targets.push({
      target: `multi-turn: ${policy} same-rank follow-up ≥ 0.9 with CoV ≤ 0.15`,
      pass: r.sameRankRate >= 0.9 && r.cov <= 0.15,
      measured: `same-rank ${f3(r.sameRankRate)}, CoV ${f3(r.cov)}`,
    });
  }

  for (const workload of workloads) {
    const policies = workload.workload === 'multi-turn' ? ['prefix-aware', 'session-affinity'] : ['prefix-aware'];
    const roundRobin = result(workload, 'round-robin');
    const least = result(workload, 'least-outstanding');
    for (const policy of policies) {
      const r = result(workload, policy);
      if (!r || !roundRobin || !least) continue;
      targets.push({
        target: `${workload.workload}: ${policy} TTFT p99 under load ≤ 0.5× round-robin`,
        pass: r.ttftP99 <= 0.5 * roundRobin.ttftP99,
        measured: `${ms(r.ttftP99)} vs ${ms(roundRobin.ttftP99)} (${f2(r.ttftP99 / roundRobin.ttftP99)}×)${floorNote(workload, roundRobin.ttftP99)}`,
      });
      targets.push({
        target: `${workload.workload}: ${policy} TTFT p99 at low load ≤ least-outstanding`,
        pass: r.low.ttftP99 <= least.low.ttftP99,
        measured: `${ms(r.low.ttftP99)} vs ${ms(least.low.ttftP99)}`,
      });
    }
  }

  for (const workload of workloads) {
    const ours = result(workload, 'prefix-aware');
    if (!ours) continue;
    targets.push({
      target: `${workload.workload}: prefix-aware max/mean load ≤ 1.3`,
      pass: ours.maxOverMean <= 1.3,
      measured: f3(ours.maxOverMean),
    });
  }

  for (const workload of workloads) {
    const ours = result(workload, 'prefix-aware');
    const sglang = result(workload, 'sglang-cache-aware');
    if (!ours || !sglang) continue;
    targets.push({
      target: `${workload.workload}: prefix-aware beats sglang-cache-aware (hit rate no lower, max/mean no higher)`,
      pass: ours.hitRate >= sglang.hitRate && ours.maxOverMean <= sglang.maxOverMean,
      measured: `hit ${f3(ours.hitRate)} vs ${f3(sglang.hitRate)}, max/mean ${f3(ours.maxOverMean)} vs ${f3(sglang.maxOverMean)}`,
    });
  }
  return targets;
}
