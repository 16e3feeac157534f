import type { Endpoint, Policy } from '../types';

/** Cycles through the candidates in order. */
export function roundRobin(): Policy {
  let cursor = 0;
  return {
    name: 'round-robin',
    readsContext: false,
    pick(candidates: readonly Endpoint[]): Endpoint {
      const chosen = candidates[cursor % candidates.length];
      cursor = (cursor + 1) % 0x7fffffff;
      return chosen;
    },
  };
}
