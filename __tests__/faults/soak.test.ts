import { describe, expect, it } from '@jest/globals';
import { runSoak } from '../../bench/soak';

/** The soak of `npm run soak` at a CI size: every fault phase runs, at a few thousand requests. */
describe('soak (small)', () => {
  it('drains every in-flight count to 0 under injected faults, with a flat heap', async () => {
    const figures = await runSoak({ requests: 2400, concurrency: 16, phases: 12, maxSeconds: 15 });
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
  }, 30_000);
});
