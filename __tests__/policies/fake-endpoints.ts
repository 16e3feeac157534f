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

/** A seeded generator, so random policies are testable. */
export { seededRng as seededRandom } from '../../bench/routing/rng';
