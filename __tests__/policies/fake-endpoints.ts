import fc from 'fast-check';
import type { Endpoint } from '../../lib';

/** A mutable endpoint for policy tests: policies read only these fields. */
export interface FakeEndpoint extends Endpoint {
  inflight: number;
  load: number;
}

/** `count` healthy endpoints on ranks 0…count−1 with the given loads (default 0). */
export function fakeEndpoints(count: number, loads: readonly number[] = []): FakeEndpoint[] {
  return Array.from({ length: count }, (_, rank) => ({
    key: `u#${rank}`,
    upstream: 'u',
    rank,
    inflight: loads[rank] ?? 0,
    load: loads[rank] ?? 0,
    healthy: true,
  }));
}

export const NO_CONTEXT = { path: '/v1/completions', affinityKey: undefined, prompt: undefined };

/**
 * A seeded uniform source in [0, 1), so random policies are testable: same seed, same picks.
 * fast-check's seeded generator, without its bias towards edge values.
 */
export function seededRandom(seed: number): () => number {
  const values = fc.sample(fc.noBias(fc.integer({ min: 0, max: 0x7fffffff })), { seed, numRuns: 10_000 });
  let next = 0;
  return () => values[next++ % values.length] / 0x80000000;
}
