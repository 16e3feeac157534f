import { endpointHash } from '../hash';
import type { Endpoint } from '../types';
import type { BlockIndex } from './prefix-aware-index';
import { PendingPrefill } from './prefix-aware-ttft';

/**
 * Everything `prefix-aware` keeps about one endpoint, in one object so that a pick reads it
 * with one lookup per candidate: the block index (made when the endpoint is first chosen: it
 * is the big part), the prefill this policy sent there and is waiting for, and the endpoint's
 * rendezvous identity.
 */
export class EndpointState {
  /** The pick that last listed this endpoint among the candidates. */
  lastCandidatePick: number;
  index: BlockIndex | undefined = undefined;
  readonly pending = new PendingPrefill();
  /** `endpointHash(key)`: the endpoint's identity in every rendezvous order. */
  readonly hash: number;

  constructor(key: string, pick: number) {
    this.hash = endpointHash(key);
    this.lastCandidatePick = pick;
  }
}

/**
 * The policy's endpoint states by key, with a cache by candidate position: the router passes
 * the same endpoint objects in the same order until the healthy set changes, so a position
 * whose endpoint is the one cached there costs one comparison instead of a `Map` lookup.
 */
export class EndpointStates {
  private readonly byKey = new Map<string, EndpointState>();
  private cachedEndpoints: Array<Endpoint | undefined> = [];
  private cachedStates: Array<EndpointState | undefined> = [];
  /** States that hold an index. */
  indexed = 0;

  /** The state of `candidate`, at position `at` of this pick's candidates; made on first sight. */
  at(candidate: Endpoint, at: number, pick: number): EndpointState {
    let state: EndpointState | undefined;
    if (this.cachedEndpoints[at] === candidate) {
      state = this.cachedStates[at]!;
    } else {
      state = this.byKey.get(candidate.key);
      if (state === undefined) {
        state = new EndpointState(candidate.key, pick);
        this.byKey.set(candidate.key, state);
      }
      this.cachedEndpoints[at] = candidate;
      this.cachedStates[at] = state;
    }
    state.lastCandidatePick = pick;
    return state;
  }

  /** The state `at` returned for position `at` during this pick. */
  cachedAt(at: number): EndpointState {
    return this.cachedStates[at]!;
  }

  /** Drops the states of endpoints no pick has listed for more than `after` picks; returns the blocks they had recently recorded. */
  forget(pick: number, after: number): number {
    let recent = 0;
    for (const [key, state] of this.byKey) {
      if (pick - state.lastCandidatePick <= after) continue;
      if (state.index !== undefined) {
        recent += state.index.recentBlocks;
        this.indexed--;
      }
      this.byKey.delete(key);
    }
    this.cachedEndpoints = [];
    this.cachedStates = [];
    return recent;
  }

  /** Every state held. */
  values(): IterableIterator<EndpointState> {
    return this.byKey.values();
  }
}
