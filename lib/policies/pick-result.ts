/**
 * What one pick found, in a module of its own: the policies that fill it and the request path
 * that reads it import nothing else from each other.
 */
import type { Endpoint, IndexSource, PickContext } from '../types';

/**
 * What a feature adds to a pick's result, by declaration merging (as `RouteSlots`): a feature
 * that steers the pick declares its member next to its code, e.g.
 *
 *   declare module '../policies/pick-result' {
 *     interface PickExtras { predictedTtftMs: number }
 *   }
 *
 * and sets it during the pick; the hooks that read it find it on the result.
 */
export interface PickExtras {}

/**
 * What a pick found: the endpoint and what the policy estimated of it. A policy keeps one
 * result and fills it on each pick, so a result is valid until the policy's next pick: whoever
 * needs a member past that (a request that waits for admission) copies it at pick time.
 */
export interface PickResult<E extends Endpoint = Endpoint> extends Partial<PickExtras> {
  /** The chosen endpoint. */
  endpoint: E;
  /** Which prefix index scored it: `exact` where the engines' KV events did, else `approximate`. */
  index: IndexSource;
  /** The share of the prompt the endpoint was estimated to hold; `undefined` from a policy that does not estimate it. */
  matchedShare: number | undefined;
  /** The prompt's blocks the endpoint was estimated to lack (its prefill, in the policy's units); `undefined` likewise. */
  uncachedBlocks: number | undefined;
}

/**
 * Where a built-in policy keeps its pick that returns a result: a symbol, so that the public
 * `Policy` (`name`, `pick`) shows nothing of it, and a user's spread copy keeps it.
 */
export const PICK_RESULT: unique symbol = Symbol('express-dp-router.pickResult');

/** A policy that returns what it found itself (the `prefix-aware` policy). */
export interface PicksResult {
  [PICK_RESULT](candidates: readonly Endpoint[], ctx: PickContext): PickResult;
}

/** A result to be filled by picks: every member present from the start, so its shape never changes. */
export function emptyResult(): PickResult {
  return { endpoint: undefined as unknown as Endpoint, index: 'approximate', matchedShare: undefined, uncachedBlocks: undefined };
}
