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

/** A seeded uniform source in [0, 1) (mulberry32), so random policies are testable: same seed, same picks. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
