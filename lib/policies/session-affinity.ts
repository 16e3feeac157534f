import { combine32, hashString, keyedMix32, randomKey32 } from '../hash';
import type { Endpoint, PickContext, Policy } from '../types';
import { parseSessionAffinity, type SessionAffinityOptions } from './session-affinity-options';

export type { SessionAffinityOptions } from './session-affinity-options';

/** Distinct endpoint keys remembered before every assignment is dropped (endpoint sets are small). */
const MAX_ENDPOINT_KEYS = 4096;

/**
 * Sends every request of a session (`ctx.affinityKey`) to the same endpoint, with bounded
 * loads on two time scales:
 *
 * - **Sessions.** A new session walks its rendezvous (highest-random-weight) order of the
 *   endpoints and is assigned to the first one holding fewer than
 *   `⌈keyLoadFactor × (sessions + 1) / endpoints⌉` sessions, and remembered (bounded LRU,
 *   see `maxSessions`). Plain hashing of a few dozen sessions onto a few endpoints is
 *   uneven (balls into bins); this is not. A remembered session stays on its endpoint while
 *   that endpoint is a candidate: removing an endpoint moves only its sessions; adding one
 *   moves none (new sessions fill it).
 * - **Requests.** When the session's endpoint has a load above both `⌈loadFactor × mean⌉` and
 *   the least load plus `loadSlack`, the request alone goes to the first endpoint of the
 *   session's order within that bound.
 *
 * Per pick: one hash of the key, one `Map` lookup and touch, two passes over the candidates;
 * no allocation beyond the LRU's own entry.
 *
 * Assignments depend on the order sessions arrive in, so two router replicas agree on a
 * session's endpoint only as far as both picked its first choice (most sessions with a
 * large `keyLoadFactor`); put one router in front of a session, or route by prefix.
 */
export function sessionAffinity(options: SessionAffinityOptions = {}): Policy {
  const { loadFactor, loadSlack, keyLoadFactor, maxSessions, fallback } = parseSessionAffinity('sessionAffinity', options);
  const endpoints = new SessionEndpoints();
  /**
   * Session slot → endpoint id, in least-recently-used order. The slot is the key's hash mixed
   * with a random key: V8 hashes integer `Map` keys without a seed, so keys a client could
   * compute would let it pile sessions into one bucket. The rendezvous order uses the plain
   * key hash, which every gateway replica computes alike.
   */
  const sessions = new Map<number, number>();
  const slotKey = randomKey32();

  function forget(slot: number, id: number): void {
    sessions.delete(slot);
    endpoints.sessions[id]--;
  }

  return {
    name: 'session-affinity',
    usesAffinityKey: true,
    pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint {
      const key = ctx.affinityKey;
      if (key === undefined || key === '') return fallback.pick(candidates, ctx);
      if (endpoints.overflows(candidates)) sessions.clear();
      endpoints.use(candidates);
      const hashes = endpoints.hashes;
      const ids = endpoints.ids;
      const counts = endpoints.sessions;
      const keyHash = hashString(key);
      const slot = keyedMix32(keyHash, slotKey);
      let home = sessions.get(slot);

      let totalLoad = 0;
      let leastLoad = Infinity;
      let totalSessions = 0;
      let homeIndex = -1;
      for (let i = 0; i < candidates.length; i++) {
        const load = candidates[i].load;
        totalLoad += load;
        if (load < leastLoad) leastLoad = load;
        totalSessions += counts[ids[i]];
        if (ids[i] === home) homeIndex = i;
      }
      // The ceiling gives integer in-flight counts a slot of slack: near idle the mean is a
      // fraction, and one request must not push a session off its endpoint. The absolute slack
      // keeps a few more there while the fleet has idle room anyway.
      const loadCap = Math.max(Math.ceil((loadFactor * totalLoad) / candidates.length), leastLoad + loadSlack);

      if (homeIndex < 0) {
        // New, forgotten, or its endpoint left: assign it anew.
        if (home !== undefined) forget(slot, home);
        const sessionCap = Math.ceil((keyLoadFactor * (totalSessions + 1)) / candidates.length);
        let bestWeight = -1;
        for (let i = 0; i < candidates.length; i++) {
          if (counts[ids[i]] >= sessionCap) continue;
          const weight = combine32(keyHash, hashes[i]) >>> 0;
          if (weight > bestWeight) {
            bestWeight = weight;
            homeIndex = i;
          }
        }
        // Some candidate is below the cap: the cap is above the mean count.
        counts[ids[homeIndex]]++;
        if (sessions.size >= maxSessions) {
          const oldest = sessions.keys().next().value as number;
          forget(oldest, sessions.get(oldest) as number);
        }
      } else {
        sessions.delete(slot); // re-inserted below: most recently used
      }
      sessions.set(slot, ids[homeIndex]);

      const homeEndpoint = candidates[homeIndex];
      if (homeEndpoint.load <= loadCap) return homeEndpoint;
      // Overloaded: this request alone goes to the next endpoint of the key's order within the bound.
      let spill: Endpoint | undefined;
      let spillWeight = -1;
      for (let i = 0; i < candidates.length; i++) {
        if (i === homeIndex || candidates[i].load > loadCap) continue;
        const weight = combine32(keyHash, hashes[i]) >>> 0;
        if (weight > spillWeight) {
          spillWeight = weight;
          spill = candidates[i];
        }
      }
      // None only when a load is NaN (the least loaded is never above the cap).
      return spill ?? homeEndpoint;
    },
  };
}

/**
 * Endpoint key hashes and small-integer ids with their session counts. The router usually
 * passes the same endpoints in the same order until the healthy set changes, so the last
 * result is reused when every position still holds the same endpoint object (a pointer
 * comparison each).
 */
class SessionEndpoints {
  /** Sessions assigned, by endpoint id. */
  sessions = new Int32Array(16);
  private readonly idOf = new Map<string, number>();
  private readonly hashOf: number[] = [];
  /** Rendezvous hashes of the candidates of the last {@link use}, by position. */
  hashes = new Int32Array(0);
  /** Ids of the candidates of the last {@link use}, by position. */
  ids = new Int32Array(0);
  private lastEndpoints: Endpoint[] = [];

  /** Whether these candidates bring the table past its bound; if so it is emptied (ids restart). */
  overflows(candidates: readonly Endpoint[]): boolean {
    if (this.sameAsLast(candidates) || this.idOf.size + candidates.length <= MAX_ENDPOINT_KEYS) return false;
    this.idOf.clear();
    this.hashOf.length = 0;
    this.sessions.fill(0);
    this.lastEndpoints = [];
    return true;
  }

  /** Sets `hashes` and `ids` for these candidates. */
  use(candidates: readonly Endpoint[]): void {
    if (!this.sameAsLast(candidates)) {
      const hashes = new Int32Array(candidates.length);
      const ids = new Int32Array(candidates.length);
      for (let i = 0; i < candidates.length; i++) {
        ids[i] = this.idFor(candidates[i].key);
        hashes[i] = this.hashOf[ids[i]];
      }
      this.lastEndpoints = candidates.slice();
      this.hashes = hashes;
      this.ids = ids;
    }
  }

  private sameAsLast(candidates: readonly Endpoint[]): boolean {
    const last = this.lastEndpoints;
    if (last.length !== candidates.length) return false;
    for (let i = 0; i < last.length; i++) if (last[i] !== candidates[i]) return false;
    return true;
  }

  private idFor(key: string): number {
    let id = this.idOf.get(key);
    if (id === undefined) {
      id = this.hashOf.length;
      this.idOf.set(key, id);
      this.hashOf.push(hashString(key, 0x5bd1e995));
      if (id >= this.sessions.length) {
        const grown = new Int32Array(this.sessions.length * 2);
        grown.set(this.sessions);
        this.sessions = grown;
      }
    }
    return id;
  }
}
