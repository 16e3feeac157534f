import { combine32, hashString } from '../hash';
import type { Endpoint, PickContext, Policy } from '../types';
import { leastOutstanding } from './least-outstanding';

/** Options of {@link sessionAffinity}. */
export interface SessionAffinityOptions {
  /**
   * Bounded-load factor `c`: an endpoint whose load is above `⌈c × mean load⌉` is skipped for
   * this request. At least 1. Default: `1.25`.
   */
  loadFactor?: number;
  /** The policy for requests without a session key. Default: `leastOutstanding()`. */
  fallback?: Policy;
}

/**
 * Sends every request of a session (`ctx.affinityKey`) to the same endpoint by rendezvous
 * (highest-random-weight) hashing, so adding or removing an endpoint moves only that
 * endpoint's sessions. A bounded-load guard keeps a hot endpoint from taking more than its
 * share: the highest-weight endpoint whose load is at most `⌈loadFactor × mean⌉` wins.
 */
export function sessionAffinity(options: SessionAffinityOptions = {}): Policy {
  const loadFactor = options.loadFactor ?? 1.25;
  if (!Number.isFinite(loadFactor) || loadFactor < 1) {
    throw new TypeError(
      `sessionAffinity: loadFactor must be a finite number >= 1 (got ${String(loadFactor)}); ` +
        'use 1.25 for the default bound.',
    );
  }
  const fallback = options.fallback ?? leastOutstanding();
  const endpointHashes = new EndpointHashCache();

  return {
    name: 'session-affinity',
    usesAffinityKey: true,
    pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint {
      const key = ctx.affinityKey;
      if (key === undefined || key === '') return fallback.pick(candidates, ctx);
      if (candidates.length === 1) return candidates[0];
      const hashes = endpointHashes.of(candidates);
      let totalLoad = 0;
      for (const candidate of candidates) totalLoad += candidate.load;
      // The ceiling gives integer in-flight counts a slot of slack: near idle the mean is a
      // fraction, and one request must not push a session off its endpoint.
      const loadCap = Math.ceil((loadFactor * totalLoad) / candidates.length);
      const keyHash = hashString(key);
      let best: Endpoint | undefined;
      let bestWeight = 0;
      for (let i = 0; i < candidates.length; i++) {
        const candidate = candidates[i];
        if (candidate.load > loadCap) continue;
        const weight = combine32(keyHash, hashes[i]) >>> 0;
        if (best === undefined || weight > bestWeight) {
          best = candidate;
          bestWeight = weight;
        }
      }
      // Unreachable with loadFactor >= 1 (the least loaded is never above the mean), but a
      // load that is NaN would skip every endpoint.
      return best ?? fallback.pick(candidates, ctx);
    },
  };
}

/**
 * Endpoint key hashes, computed once per key. The router usually passes the same endpoints
 * in the same order until the healthy set changes, so the last result is reused when every
 * position still holds the same endpoint object (a pointer comparison each).
 */
class EndpointHashCache {
  private readonly byKey = new Map<string, number>();
  private lastEndpoints: Endpoint[] = [];
  private lastHashes = new Int32Array(0);

  of(candidates: readonly Endpoint[]): Int32Array {
    if (this.sameAsLast(candidates)) return this.lastHashes;
    const hashes = new Int32Array(candidates.length);
    for (let i = 0; i < candidates.length; i++) hashes[i] = this.hashOf(candidates[i].key);
    this.lastEndpoints = candidates.slice();
    this.lastHashes = hashes;
    return hashes;
  }

  private sameAsLast(candidates: readonly Endpoint[]): boolean {
    const last = this.lastEndpoints;
    if (last.length !== candidates.length) return false;
    for (let i = 0; i < last.length; i++) if (last[i] !== candidates[i]) return false;
    return true;
  }

  private hashOf(key: string): number {
    let hash = this.byKey.get(key);
    if (hash === undefined) {
      // Endpoint sets are small and change rarely; forgetting everything on overflow is
      // enough to bound the map when keys churn.
      if (this.byKey.size >= 4096) this.byKey.clear();
      hash = hashString(key, 0x5bd1e995);
      this.byKey.set(key, hash);
    }
    return hash;
  }
}
