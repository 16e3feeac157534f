import type { Endpoint, Policy } from '../types';
import type { RandomSource } from './random';

/**
 * Samples two distinct candidates and keeps the less loaded one: nearly the balance of
 * least-outstanding without every gateway replica herding onto the same idlest endpoint.
 */
export function powerOfTwo(rng: RandomSource = Math.random): Policy {
  return {
    name: 'power-of-two',
    readsContext: false,
    pick(candidates: readonly Endpoint[]): Endpoint {
      const count = candidates.length;
      if (count === 1) return candidates[0];
      const first = Math.floor(rng() * count);
      // Draw from the other count − 1 slots so the two samples always differ.
      const second = (first + 1 + Math.floor(rng() * (count - 1))) % count;
      const a = candidates[first];
      const b = candidates[second];
      return b.load < a.load ? b : a;
    },
  };
}
