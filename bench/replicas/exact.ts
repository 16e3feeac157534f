import { endpointHash, rendezvousWeight } from '../../lib/hash';
import type { Endpoint, Policy } from '../../lib/types';
import type { SimView } from '../routing/simulator';

/** Weight of a new sample in the running mean of the uncached blocks a request needs (as prefix-aware). */
const WORK_SMOOTHING = 1 / 32;

/**
 * What exact routing from KV events amounts to: every replica knows each rank's real cache
 * (the simulator's), and weighs it as prefix-aware does: uncached blocks plus the queue ahead
 * (extra in-flight requests × the mean uncached blocks per request), the cheapest winning and
 * the request's rendezvous order deciding ties, so that replicas place a new prefix alike.
 */
export function exactCache(view: SimView): Policy {
  let typicalWork = -1;
  return {
    name: 'exact',
    pick(candidates: readonly Endpoint[]): Endpoint {
      const blocks = view.current().inputBlocks;
      const count = blocks.length;
      const lead = count === 0 ? 0 : blocks[Math.min(count, 4) - 1];
      let minLoad = Infinity;
      for (const candidate of candidates) minLoad = Math.min(minLoad, candidate.load);
      const work = typicalWork < 0 ? count : typicalWork;
      let best = candidates[0];
      let bestCost = Infinity;
      let bestUncached = count;
      for (const candidate of candidates) {
        const uncached = count - view.rankOf(candidate).cache.peek(blocks);
        const cost = uncached + work * (candidate.load - minLoad);
        const better =
          cost < bestCost ||
          (cost === bestCost && rendezvousWeight(lead, endpointHash(candidate.key)) > rendezvousWeight(lead, endpointHash(best.key)));
        if (better) [best, bestCost, bestUncached] = [candidate, cost, uncached];
      }
      typicalWork = typicalWork < 0 ? bestUncached : typicalWork + (bestUncached - typicalWork) * WORK_SMOOTHING;
      return best;
    },
  };
}
