import { describe, expect, it } from '@jest/globals';
import { runFleet } from '../../bench/gateways/fleet';

describe('three gateway processes sharing one mock vLLM', () => {
  it('balance the engines better with load feedback when one gateway\'s clients pin a rank', async () => {
    const base = { gateways: 3, ranks: 8, rate: 120, seconds: 3, decodeMsPerToken: 10, pinnedShare: 0.3, seed: 5, feedbackWeight: 1 };
    const local = await runFleet({ ...base, feedbackMs: 0 });
    const informed = await runFleet({ ...base, feedbackMs: 200 });
    expect(local.errors + informed.errors).toBe(0);
    // Without feedback the other gateways keep sending rank 0 its even share on top of the pins.
    expect(local.averagedMaxOverMean).toBeGreaterThan(1.25);
    expect(informed.averagedMaxOverMean).toBeLessThan(local.averagedMaxOverMean - 0.15);
    expect(informed.shares[0]).toBeLessThan(local.shares[0]);
  }, 90_000);
});
