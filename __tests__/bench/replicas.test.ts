import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { runBench } from './cli';

/** The contenders in table order; `--compare` adds its rows after `approximate`. */
const POLICIES = ['round-robin', 'approximate', 'approximate (prefix-aware)', 'exact (KV events)', 'oracle'];

/** The scenarios and their contenders, in table order. */
const SCENARIOS = ['pressure', 'rolling-restart', 'bypass', 'multi-tenant', 'multi-turn'];
const SCENARIO_POLICIES = [
  'round-robin',
  'approximate',
  'approximate + feedback',
  'exact',
  'exact + feedback',
  'exact + replay',
  'approximate + peers',
  'exact + peers',
  'oracle',
];

interface Result {
  policy: string;
  replicas: number;
  cache: string;
  rankCacheBlocks: number;
  hitRate: number;
  ttftP50: number;
  ttftP99: number;
  maxOverMean: number;
  completed: number;
}

interface PooledHit {
  requests: number;
  hitRate: number;
  steadyHitRate: number;
}

interface Report {
  ranks: number;
  requests: number;
  results: Result[];
  targets: Array<{ target: string; pass: boolean; measured: string }>;
  ceilingHitRate: number;
  scenarioTargets: Array<{ target: string; pass: boolean; measured: string }>;
  scenarioResults: Array<{ scenario: string; policy: string; hitRate: number; ttftP99: number; maxOverMean: number }>;
  scenarioWarmup: {
    windowSeconds: number;
    firstRequests: number;
    restarts: Array<{ at: number; gateway: number }>;
    results: Array<{ policy: string; window: PooledHit; first: PooledHit }>;
  };
}

const WARMUP_TARGET = "rolling-restart: a restarted replica's hit rate in its first 10 s within 2 points of steady state (exact + replay)";

/**
 * `npm run bench:replicas -- --size small --seed 42 --out DIR`, comparing against the policy
 * file itself (so that its rows must equal `approximate`'s), read back from the JSON it writes.
 */
async function runReplicas(dir: string): Promise<{ report: Report; stdout: string }> {
  const args = ['--size', 'small', '--seed', '42', '--out', dir, '--compare', 'lib/policies/prefix-aware.ts'];
  const run = await runBench('bench/replicas/main.ts', args, 60_000);
  if (run.code !== 0) throw new Error(`bench:replicas exited with ${run.code}\n${run.stderr}`);
  return { report: JSON.parse(readFileSync(join(dir, 'replicas-small.json'), 'utf8')) as Report, stdout: run.stdout };
}

describe('gateway replicas benchmark (small)', () => {
  const dirs = [mkdtempSync(join(tmpdir(), 'dp-router-replicas-')), mkdtempSync(join(tmpdir(), 'dp-router-replicas-'))];
  let report: Report;
  let again: Report;
  let stdout: string;

  beforeAll(async () => {
    const [first, second] = await Promise.all(dirs.map(runReplicas));
    ({ report, stdout } = first);
    again = second.report;
  }, 90_000);

  afterAll(() => {
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  it('is deterministic for a seed', () => {
    expect(again.results).toEqual(report.results);
  });

  it('reports every policy with 1, 2 and 3 replicas on both cache sizes, with sane numbers', () => {
    const cells = report.results.map((r) => `${r.cache} ${r.policy} ${r.replicas}`);
    const expected = ['fits', 'pressure'].flatMap((cache) => POLICIES.flatMap((policy) => [1, 2, 3].map((n) => `${cache} ${policy} ${n}`)));
    expect(cells).toEqual(expected);
    const fits = report.results.find((r) => r.cache === 'fits') as Result;
    for (const r of report.results) {
      expect(r.completed).toBe(report.requests);
      expect(r.hitRate).toBeGreaterThanOrEqual(0);
      expect(r.hitRate).toBeLessThan(1);
      expect(r.maxOverMean).toBeGreaterThanOrEqual(1);
      expect(r.maxOverMean).toBeLessThanOrEqual(report.ranks);
      expect(r.ttftP50).toBeGreaterThan(0);
      expect(r.ttftP99).toBeGreaterThanOrEqual(r.ttftP50);
      if (r.cache === 'pressure') expect(r.rankCacheBlocks).toBe(Math.ceil(fits.rankCacheBlocks / 2));
    }
    const roundRobin = report.results.find((r) => r.policy === 'round-robin' && r.replicas === 1);
    expect(roundRobin?.maxOverMean).toBeCloseTo(1, 5);
  });

  it('runs the --compare file as another contender: the same policy gives the same figures', () => {
    const strip = ({ policy, ...figures }: Result) => figures;
    const rows = (policy: string) => report.results.filter((r) => r.policy === policy).map(strip);
    expect(rows('approximate (prefix-aware)')).toEqual(rows('approximate'));
  });

  it('prints the table and meets the targets on both cache sizes', () => {
    expect(stdout).toMatch(/^policy +replicas +hit \(fits\) +TTFT p99 ms +max\/mean +hit \(pressure\)/m);
    expect(report.targets.map((t) => `${t.pass ? 'PASS' : 'MISS'} ${t.target}`)).toEqual([
      'PASS cache fits: approximate with 3 replicas ≥ 0.85× approximate with 1 replica',
      'PASS cache pressure: approximate with 3 replicas ≥ 0.85× approximate with 1 replica',
      'PASS cache fits: exact (KV events) with 3 replicas ≥ 0.95× exact (KV events) with 1 replica',
      'PASS cache pressure: exact (KV events) with 3 replicas ≥ 0.95× exact (KV events) with 1 replica',
      'PASS cache pressure: exact (KV events) with 1 replica ≥ approximate + 5 points',
    ]);
    expect(report.ceilingHitRate).toBeGreaterThan(Math.max(...report.results.map((r) => r.hitRate)));
  });

  it("measures a restarted replica's warm-up against the same requests without restarts", () => {
    const warmup = report.scenarioWarmup;
    expect(again.scenarioWarmup).toEqual(warmup);
    expect(warmup.windowSeconds).toBe(10);
    expect(warmup.restarts).toHaveLength(3);
    for (const { window, first } of warmup.results) {
      expect(window.requests).toBeGreaterThan(0);
      // Fewer where the run ends before the last restarted replica has routed them all.
      expect(first.requests).toBeGreaterThan(0);
      expect(first.requests).toBeLessThanOrEqual(warmup.restarts.length * warmup.firstRequests);
    }
    // The oracle keeps no state, so a restart changes none of its picks: anything but equal
    // figures would mean the restarted and steady runs are not matched request for request.
    const oracle = warmup.results.find((r) => r.policy === 'oracle');
    expect(oracle?.window.hitRate).toBe(oracle?.window.steadyHitRate);
    expect(oracle?.first.hitRate).toBe(oracle?.first.steadyHitRate);
    expect(report.scenarioTargets.map((t) => t.target)).toContain(WARMUP_TARGET);
    expect(stdout).toMatch(/^rolling-restart warm-up: /m);
    expect(stdout).toContain(`  ${WARMUP_TARGET}: `);
  });

  it('judges the rolling restart with replay from its own row, next to the line without it', () => {
    const row = (policy: string) => report.scenarioResults.find((r) => r.scenario === 'rolling-restart' && r.policy === policy)!;
    const targets = report.scenarioTargets.filter((t) => t.target.startsWith('rolling-restart: exact') && !t.target.includes('exact + peers'));
    expect(targets.map((t) => t.target)).toEqual([
      'rolling-restart: exact hit rate ≥ approximate + 5 points (3 replicas)',
      "rolling-restart: exact TTFT p99 ≤ 0.8× approximate's (3 replicas)",
      'rolling-restart: exact with replay hit rate ≥ approximate + 5 points (3 replicas)',
    ]);
    expect(targets[2].pass).toBe(row('exact + replay').hitRate >= row('approximate').hitRate + 0.05);
    expect(targets[2].measured).toMatch(new RegExp(`^${(row('exact + replay').hitRate * 100).toFixed(1)}% vs `));
  });

  it('runs every scenario contender, peers included, deterministically', () => {
    expect(report.scenarioResults.map((r) => `${r.scenario} ${r.policy}`)).toEqual(SCENARIOS.flatMap((scenario) => SCENARIO_POLICIES.map((policy) => `${scenario} ${policy}`)));
    expect(again.scenarioResults).toEqual(report.scenarioResults);
    expect(report.scenarioWarmup.results.map((r) => r.policy)).toEqual(SCENARIO_POLICIES);
  });

  it('judges exact + peers where exact must pay and on every scenario, from its own rows, after the lines without it', () => {
    const row = (scenario: string, policy: string) => report.scenarioResults.find((r) => r.scenario === scenario && r.policy === policy)!;
    const expected = SCENARIOS.flatMap((scenario) => {
      const peers = row(scenario, 'exact + peers');
      const approx = row(scenario, 'approximate');
      const againstApproximate = [
        { target: `${scenario}: exact + peers TTFT p99 ≤ 0.8× approximate's (3 replicas)`, pass: peers.ttftP99 <= 0.8 * approx.ttftP99 },
        { target: `${scenario}: exact + peers hit rate ≥ approximate + 5 points (3 replicas)`, pass: peers.hitRate >= approx.hitRate + 0.05 },
      ];
      return [
        ...(['pressure', 'rolling-restart', 'bypass'].includes(scenario) ? againstApproximate : []),
        { target: `${scenario}: exact + peers TTFT p99 ≤ 0.5× round-robin's`, pass: peers.ttftP99 <= 0.5 * row(scenario, 'round-robin').ttftP99 },
        { target: `${scenario}: exact + peers max/mean ≤ 1.3`, pass: peers.maxOverMean <= 1.3 },
      ];
    });
    const peersTargets = report.scenarioTargets.filter((t) => t.target.includes('exact + peers'));
    expect(peersTargets.map(({ target, pass }) => ({ target, pass }))).toEqual(expected);
    const targets = report.scenarioTargets.map((t) => t.target);
    expect(targets.filter((t) => !t.includes('exact + peers'))).toEqual([
      'pressure: exact hit rate ≥ approximate + 5 points (3 replicas)',
      "pressure: exact TTFT p99 ≤ 0.8× approximate's (3 replicas)",
      'rolling-restart: exact hit rate ≥ approximate + 5 points (3 replicas)',
      "rolling-restart: exact TTFT p99 ≤ 0.8× approximate's (3 replicas)",
      'rolling-restart: exact with replay hit rate ≥ approximate + 5 points (3 replicas)',
      WARMUP_TARGET,
      'bypass: exact hit rate ≥ approximate + 5 points (3 replicas)',
      "bypass: exact TTFT p99 ≤ 0.8× approximate's (3 replicas)",
    ]);
    // Each scenario's lines together, those without peers first.
    expect(targets.indexOf(WARMUP_TARGET)).toBeLessThan(targets.indexOf("rolling-restart: exact + peers TTFT p99 ≤ 0.8× approximate's (3 replicas)"));
    expect(targets.indexOf("rolling-restart: exact + peers max/mean ≤ 1.3")).toBeLessThan(targets.indexOf('bypass: exact hit rate ≥ approximate + 5 points (3 replicas)'));
  });

  it("shortens exact routing's tail where it must pay once the replicas tell each other what they sent", () => {
    // Holds at this size (small, seed 42) in all three scenarios, as in the full run: the peers'
    // announcements change the picks that put a miss behind another replica's.
    const p99 = (scenario: string, policy: string) => report.scenarioResults.find((r) => r.scenario === scenario && r.policy === policy)!.ttftP99;
    for (const scenario of ['pressure', 'rolling-restart', 'bypass']) expect(p99(scenario, 'exact + peers')).toBeLessThan(p99(scenario, 'exact'));
  });

  it('rejects an unknown flag with a usage line', async () => {
    const run = await runBench('bench/replicas/main.ts', ['--replicas', '4'], 30_000);
    expect(run.code).not.toBe(0);
    expect(run.stderr).toMatch(/usage: --size small\|full --out DIR --seed N --compare FILE\.ts/);
  });
});
