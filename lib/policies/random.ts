import type { Endpoint, Policy } from '../types';

/** A source of uniform numbers in [0, 1); seed one to make a simulation repeatable. */
export type RandomSource = () => number;

/** Picks a candidate uniformly at random. */
export function random(rng: RandomSource = Math.random): Policy {
  return {
    name: 'random',
    readsContext: false,
    pick(candidates: readonly Endpoint[]): Endpoint {
      return candidates[Math.floor(rng() * candidates.length)];
    },
  };
}
