/**
 * Smoke test of `npm run bench:overhead`: one tiny round of the contenders below, run as
 * the real subprocess tree (mock upstream, contenders, autocannon and the paced generator).
 * It checks correctness only, never timing: every response carried a valid rank (exactly one
 * rank header, a routable rank, for every router contender; none for the plain proxies), no
 * request failed, and the table lists every contender.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from '@jest/globals';

const ROOT = resolve(__dirname, '..', '..');
// The two comparators, and the router on each path a policy takes through it: the default
// header-only policy, one that reads a header key (session-affinity) and one that reads the body
// (prefix-aware). The other policies differ only in `pick`, tested in __tests__/policies/; every
// contender costs a process and three load runs, and this suite runs on four Node lines in CI.
const CONTENDERS = [
  'upstream-direct',
  'baseline',
  'baseline+json',
  'router:least-outstanding',
  'router:session-affinity',
  'router:prefix-aware',
];

interface Summary {
  body: number;
  mode: string;
  contender: string;
  responses: number;
  rankChecked: number;
  rankWrong: number;
  non2xx: number;
  errors: number;
}

interface Report {
  summaries: Summary[];
  rankTotals: Record<string, { checked: number; wrong: number; wrongSamples: string[] }>;
  targets: Array<{ name: string; pass: boolean; figure: string }>;
}

describe('bench:overhead --quick', () => {
  it('runs every contender and every response carries a valid rank', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dp-router-bench-'));
    const out = join(dir, 'overhead.json');
    try {
      const stdout = await new Promise<string>((done, fail) => {
        execFile(
          process.execPath,
          [
            '--import',
            'tsx',
            join(ROOT, 'bench', 'overhead', 'main.ts'),
            '--quick',
            '--duration',
            '0.4',
            '--half-duration',
            '0.4',
            // No warm-up: correctness needs none, and autocannon runs whole seconds.
            '--warmup',
            '0',
            '--connections',
            '4',
            '--bodies',
            '256',
            '--half-bodies',
            '256',
            '--modes',
            'sat,half',
            '--contenders',
            CONTENDERS.join(','),
            '--out',
            out,
          ],
          { cwd: ROOT, maxBuffer: 16 * 1024 * 1024, timeout: 150_000 },
          (error, stdout, stderr) => (error ? fail(new Error(`${error.message}\n${stderr}`)) : done(stdout)),
        );
      });
      const report = JSON.parse(readFileSync(out, 'utf8')) as Report;

      for (const mode of ['sat', 'half']) {
        const listed = report.summaries.filter((s) => s.mode === mode).map((s) => s.contender);
        expect(listed.sort()).toEqual([...CONTENDERS].sort());
      }
      for (const contender of CONTENDERS) {
        expect(stdout).toContain(`| ${contender} `);
        const total = report.rankTotals[contender];
        expect({ contender, wrong: total.wrong, samples: total.wrongSamples }).toEqual({ contender, wrong: 0, samples: [] });
        expect(total.checked).toBeGreaterThan(0);
      }
      for (const summary of report.summaries) {
        // Every response was checked, none carried a wrong rank, and none failed.
        expect(summary.rankChecked).toBe(summary.responses);
        expect(summary.responses).toBeGreaterThan(0);
        expect({ contender: summary.contender, mode: summary.mode, wrong: summary.rankWrong, failed: summary.non2xx + summary.errors }).toEqual({
          contender: summary.contender,
          mode: summary.mode,
          wrong: 0,
          failed: 0,
        });
      }
      // The rank targets are printed and pass; timing targets are printed but not asserted.
      const rankTargets = report.targets.filter((t) => t.name.includes('carried the right rank'));
      expect(rankTargets).toHaveLength(CONTENDERS.length);
      for (const target of rankTargets) expect(target.pass).toBe(true);
      expect(stdout).toMatch(/^(PASS|MISS) /m);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 180_000);
});
