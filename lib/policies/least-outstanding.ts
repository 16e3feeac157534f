import type { Endpoint, Policy } from '../types';

/**
 * Picks the endpoint with the lowest load. Ties rotate, so an idle fleet still spreads
 * requests evenly instead of piling onto the first endpoint.
 */
export function leastOutstanding(): Policy {
  let cursor = 0;
  return {
    name: 'least-outstanding',
    readsContext: false,
    pick(candidates: readonly Endpoint[]): Endpoint {
      const count = candidates.length;
      const start = (cursor = (cursor + 1) % 0x7fffffff) % count;
      let best = candidates[start];
      let bestLoad = best.load;
      // The rotation start+1 … count−1, 0 … start−1 as two plain runs: no modulo per step, and
      // each candidate's load (a getter) read once.
      for (let index = start + 1; index < count; index++) {
        const load = candidates[index].load;
        if (load < bestLoad) {
          best = candidates[index];
          bestLoad = load;
        }
      }
      for (let index = 0; index < start; index++) {
        const load = candidates[index].load;
        if (load < bestLoad) {
          best = candidates[index];
          bestLoad = load;
        }
      }
      return best;
    },
  };
}
