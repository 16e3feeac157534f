import { combine32, hashString, keyedMix32, randomKey32 } from '../hash';
import type { Endpoint, PickContext, Policy } from '../types';
import { leastOutstanding } from './least-outstanding';

/** Options of {@link sessionAffinity}. */
export interface SessionAffinityOptions {
  /**
   * In-flight guard `c`: a request whose session's endpoint has a load above
   * `max(⌈c × mean load⌉, least load + loadSlack)` goes, this once, to the next endpoint of the
   * session's hash order that is within that bound; the session keeps its endpoint. At least 1.
   * Default: `1.25`.
   */
  loadFactor?: number;
  /**
   * The in-flight guard's absolute slack: the session's endpoint keeps its requests while its
   * load is at most this much above the least loaded candidate's, whatever the ratio says (as
   * SGLang's `balance_abs_threshold`). At low load a ratio alone is noise: with 8 requests in
   * flight on 8 endpoints the mean is 1, so two other sessions' requests would push a session
   * away from its cache although nothing queues. A hot session still spills once its endpoint
   * is this far ahead. `0` leaves only the ratio. Default: `4` (with 8 sessions in flight on
   * 8 endpoints, about 1 follow-up turn in 2000 spills).
   */
  loadSlack?: number;
  /**
   * Key balance `c_k`: a new session is assigned to the first endpoint of its hash order that
   * holds fewer than `⌈c_k × (sessions + 1) / endpoints⌉` of the remembered sessions
   * (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam 2018). `1`
   * keeps the session counts within one of each other, which is what balances a few long
   * conversations; larger values let more sessions land on their first-choice endpoint, so
   * router replicas and forgotten sessions agree more often. At least 1. Default: `1`.
   */
  keyLoadFactor?: number;
  /**
   * The memory bound: how many sessions are remembered, least recently used first out. Each
   * is a 32-bit hash of the key and an endpoint number in a `Map` (about 50 bytes; ~3 MiB for
   * the default), whatever the key's length. A forgotten session that returns is assigned
   * anew (most often to the same endpoint). Two keys whose hashes collide share an
   * assignment, which costs nothing but a little balance. Default: `65536`.
   */
  maxSessions?: number;
  /** The policy for requests without a session key. Default: `leastOutstanding()`. */
  fallback?: Policy;
}

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
  const loadFactor = atLeastOne(options.loadFactor ?? 1.25, 'loadFactor', 'use 1.25 for the default bound.');
  const loadSlack = options.loadSlack ?? 4;
  if (!Number.isFinite(loadSlack) || loadSlack < 0) {
    throw new TypeError(`sessionAffinity: loadSlack must be a finite number >= 0 (got ${String(loadSlack)}); use 4 for the default slack.`);
  }
  const keyLoadFactor = atLeastOne(options.keyLoadFactor ?? 1, 'keyLoadFactor', 'use 1 for the default bound.');
  const maxSessions = options.maxSessions ?? 65536;
  if (!Number.isInteger(maxSessions) || maxSessions < 1) {
    throw new TypeError(`sessionAffinity: maxSessions must be a positive integer (got ${String(maxSessions)}).`);
  }
  const fallback = options.fallback ?? leastOutstanding();
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

function atLeastOne(value: number, name: string, hint: string): number {
  if (!Number.isFinite(value) || value < 1) {
    throw new TypeError(`sessionAffinity: ${name} must be a finite number >= 1 (got ${String(value)}); ${hint}`);
  }
  return value;
}
