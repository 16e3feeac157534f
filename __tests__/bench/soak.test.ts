import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from '@jest/globals';
import { runBench } from './cli';

interface SoakFigures {
  requests: number;
  outcomes: Record<string, number>;
  upstreamErrors: Record<string, number>;
  finalInflight: Record<string, number>;
  engineRunning: number;
  memory: { heapBeforeMb: number; heapAfterMb: number };
}

/** The soak of `npm run soak` at a CI size: every fault phase runs, at a few thousand requests. */
describe('soak (small)', () => {
  it('drains every in-flight count to 0 under injected faults, with a flat heap', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dp-router-soak-'));
    const out = join(dir, 'soak.json');
    try {
      const args = ['--requests', '2400', '--concurrency', '16', '--phases', '12', '--max-seconds', '15', '--out', out];
      const run = await runBench('bench/soak.ts', args, 50_000);
      const figures = JSON.parse(readFileSync(out, 'utf8')) as SoakFigures;
      expect(figures.requests).toBeGreaterThan(1000);
      expect(Object.values(figures.finalInflight)).toEqual([0, 0, 0, 0]);
      expect(figures.engineRunning).toBe(0);
      // What a client may see under these faults: answers, injected 500s passed through, the
      // gateway's 502/504, and streams cut by an upstream dying mid-answer.
      for (const outcome of Object.keys(figures.outcomes)) {
        expect(['status_200', 'status_500', 'status_502', 'status_504', 'cut', 'client_abort']).toContain(outcome);
      }
      expect(figures.outcomes.status_200).toBeGreaterThan(figures.requests * 0.8);
      expect(figures.upstreamErrors.status_5xx).toBe(figures.outcomes.status_500 ?? 0);
      expect(figures.memory.heapAfterMb - figures.memory.heapBeforeMb).toBeLessThan(32);
      // The command line's own verdict: in-flight drained and the heap stayed within its limit.
      expect({ code: run.code, stderr: run.stderr }).toEqual({ code: 0, stderr: '' });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
