import { describe, expect, it } from '@jest/globals';
import { runBench } from './cli';

interface FleetResult {
  averagedMaxOverMean: number;
  shares: number[];
  requests: number;
  errors: number;
}

/** One `npm run bench:gateways -- --single …` run: three gateway processes sharing one mock vLLM. */
async function runFleet(feedbackMs: number): Promise<FleetResult> {
  const settings = { gateways: 3, ranks: 8, rate: 120, seconds: 3, 'decode-ms': 10, 'pinned-share': 0.3, seed: 5, 'feedback-weight': 1, 'feedback-ms': feedbackMs };
  const args = ['--single', ...Object.entries(settings).flatMap(([flag, value]) => [`--${flag}`, String(value)])];
  const run = await runBench('bench/gateways/main.ts', args, 60_000);
  if (run.code !== 0) throw new Error(`bench:gateways exited with ${run.code}\n${run.stderr}`);
  return (JSON.parse(run.stdout) as { result: FleetResult }).result;
}

describe('three gateway processes sharing one mock vLLM', () => {
  it('balance the engines better with load feedback when one gateway\'s clients pin a rank', async () => {
    // Both fleets at once, on the same seeded arrivals: whatever else loads the machine loads
    // both alike, so the comparison measures the feedback and not the moment each ran.
    const [local, informed] = await Promise.all([runFleet(0), runFleet(200)]);
    expect(informed.requests).toBe(local.requests);
    expect(local.errors + informed.errors).toBe(0);
    // Without feedback the other gateways keep sending rank 0 its even share on top of the pins.
    expect(local.averagedMaxOverMean).toBeGreaterThan(1.25);
    expect(informed.averagedMaxOverMean).toBeLessThan(local.averagedMaxOverMean - 0.15);
    expect(informed.shares[0]).toBeLessThan(local.shares[0]);
  }, 120_000);
});
