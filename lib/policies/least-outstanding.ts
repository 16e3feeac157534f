import type { Endpoint, Policy } from '../types';

/**
 * Picks the endpoint with the lowest load. Ties rotate, so an idle fleet still spreads
 * requests evenly instead of piling onto the first endpoint.
 */
export function leastOutstanding(): Policy {
  let cursor = 0;
  return {
    name: 'least-outstanding',
    pick(candidates: readonly Endpoint[]): Endpoint {
      const count = candidates.length;
      const start = (cursor = (cursor + 1) % 0x7fffffff) % count;
      let best = candidates[start];
      for (let step = 1; step < count; step++) {
        const candidate = candidates[(start + step) % count];
        if (candidate.load < best.load) best = candidate;
      }
      return best;
    },
  };
}
