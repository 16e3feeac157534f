import type { Endpoint, PickContext, Policy } from '../types';
import { emptyResult, PICK_RESULT, type PicksResult, type PickResult } from './pick-result';
import type { PrefixPickContext } from './prefix-aware';

export type { PickResult } from './pick-result';

/**
 * A policy as the router runs it, made once at creation from the public `Policy` (`name`,
 * `pick`, its optional flags): what it needs, read once, and a pick that returns what it found.
 */
export interface RoutePolicy {
  readonly name: string;
  /** The router reads the body and passes `ctx.prompt`. */
  readonly usesPrompt: boolean;
  /** The router reads the session key into `ctx.affinityKey`. */
  readonly usesAffinityKey: boolean;
  /** `false`: one shared context serves every pick (the policy reads nothing of it). */
  readonly readsContext: boolean;
  /** The policy scores on a prefix index: exact routing adds its view (`ctx.exact`), the decision header names the index. */
  readonly namesIndex: boolean;
  /** Its results carry `matchedShare`. */
  readonly reportsMatchedShare: boolean;
  /** Its results carry `uncachedBlocks` (announced to peers). */
  readonly reportsUncachedBlocks: boolean;
  /** It reads each candidate's first-token totals, which the router then keeps. */
  readonly learnsFirstTokens: boolean;
  /**
   * The pick among `candidates` and what it found. The result is the policy's own, filled
   * again by its next pick: read it at once, copy what must outlive that.
   */
  pick<E extends Endpoint>(candidates: readonly E[], ctx: PickContext): PickResult<E>;
}

/**
 * The router's form of `policy`, made once: a built-in that returns its result itself keeps
 * its own pick; any other policy's pick is wrapped, its `matchedShare` and `uncachedBlocks`
 * (where it reports them) read right after the pick, before any other pick can change them.
 */
export function routePolicy(policy: Policy): RoutePolicy {
  const reportsMatchedShare = policy.reportsMatchedShare === true;
  const reportsUncachedBlocks = policy.uncachedBlocks !== undefined;
  const namesIndex = policy.namesIndex === true;
  const own = (policy as Partial<PicksResult>)[PICK_RESULT];
  let pick: (candidates: readonly Endpoint[], ctx: PickContext) => PickResult;
  if (typeof own === 'function') {
    pick = (candidates, ctx) => own.call(policy, candidates, ctx);
  } else if (!namesIndex && !reportsMatchedShare && !reportsUncachedBlocks) {
    // The common case (every built-in but prefix-aware): only the endpoint changes.
    const result = emptyResult();
    pick = (candidates, ctx) => {
      result.endpoint = policy.pick(candidates, ctx);
      return result;
    };
  } else {
    const result = emptyResult();
    pick = (candidates, ctx) => {
      result.endpoint = policy.pick(candidates, ctx);
      // Set by the exact view's `chose`, which a policy that names the index calls.
      result.index = (ctx as PrefixPickContext).exact?.source ?? 'approximate';
      if (reportsMatchedShare) result.matchedShare = policy.matchedShare;
      if (reportsUncachedBlocks) result.uncachedBlocks = policy.uncachedBlocks;
      return result;
    };
  }
  return {
    name: policy.name,
    usesPrompt: policy.usesPrompt === true,
    usesAffinityKey: policy.usesAffinityKey === true,
    readsContext: policy.readsContext !== false,
    namesIndex,
    reportsMatchedShare,
    reportsUncachedBlocks,
    learnsFirstTokens: policy.learnsFirstTokens === true,
    pick: pick as RoutePolicy['pick'],
  };
}
