import { describe, expect, it } from '@jest/globals';
import { runBench } from './cli';

interface FleetResult {
  averagedMaxOverMean: number;
  shares: number[];
  requests: number;
  errors: number;
}

/** One `npm run bench:gateways -- --single …` run: three gateway processes sharing one mock vLLM. */
async function runFleet(feedbackMs: number, peers: 'off' | 'udp' | 'redis' = 'off'): Promise<FleetResult> {
  const settings = { gateways: 3, ranks: 8, rate: 120, seconds: 3, 'decode-ms': 10, 'pinned-share': 0.3, seed: 5, 'feedback-weight': 1, 'feedback-ms': feedbackMs, peers };
  const args = ['--single', ...Object.entries(settings).flatMap(([flag, value]) => [`--${flag}`, String(value)])];
  const run = await runBench('bench/gateways/main.ts', args, 60_000);
  if (run.code !== 0) throw new Error(`bench:gateways exited with ${run.code}\n${run.stderr}`);
  return (JSON.parse(run.stdout) as { result: FleetResult }).result;
}

/** `informed` (feedback or peers) against `local` counts, run at the same time on the same seeded arrivals. */
function expectBetterBalance(local: FleetResult, informed: FleetResult): void {
  expect(informed.requests).toBe(local.requests);
  expect(local.errors + informed.errors).toBe(0);
  // With local counts only the other gateways keep sending rank 0 its even share on top of the pins.
  expect(local.averagedMaxOverMean).toBeGreaterThan(1.25);
  expect(informed.averagedMaxOverMean).toBeLessThan(local.averagedMaxOverMean - 0.15);
  expect(informed.shares[0]).toBeLessThan(local.shares[0]);
}

describe('three gateway processes sharing one mock vLLM', () => {
  // Both fleets of a test at once: whatever else loads the machine loads both alike, so the
  // comparison measures the information and not the moment each ran.
  it("balance the engines better with load feedback when one gateway's clients pin a rank", async () => {
    const [local, informed] = await Promise.all([runFleet(0), runFleet(200)]);
    expectBetterBalance(local, informed);
  }, 120_000);

  it("balance the engines better with peers, which announce each gateway's in-flight counts over UDP at once, when one gateway's clients pin a rank", async () => {
    const [local, peers] = await Promise.all([runFleet(0), runFleet(0, 'udp')]);
    expectBetterBalance(local, peers);
  }, 120_000);

  it('balance the engines as well with peers over a real redis-server (--peers redis: --redis, --peer-redis)', async () => {
    const [local, peers] = await Promise.all([runFleet(0), runFleet(0, 'redis')]);
    expectBetterBalance(local, peers);
  }, 120_000);
});
