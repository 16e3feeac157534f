import type { ExactPick } from './exact-pick';
import type { PickSteer } from './pick-steer';
import type { PicksResult } from './pick-result';
import type { PickContext, Policy } from '../types';

/**
 * What the router adds to the pick context when exact routing from KV events applies: per
 * candidate, the blocks its rank holds by the engines' own events, or −1 for a candidate
 * scored on the approximate index.
 */
export interface PrefixPickContext extends PickContext {
  readonly exact?: ExactPick;
  /** With `slo`: the request's objectives, which take the pick from the policy's estimates (lib/slo). */
  readonly slo?: PickSteer;
}

/** The `prefix-aware` policy, with what its last pick estimated (read right after `pick`, e.g. for tracing). */
export interface PrefixAwarePolicy extends Policy, PicksResult {
  /** The share of the last picked prompt's blocks the chosen endpoint was estimated to hold; 0 without a prompt. */
  readonly matchedShare: number;
  /** The last picked prompt's blocks the chosen endpoint was estimated to lack (its prefill, in blocks); 0 without a prompt. */
  readonly uncachedBlocks: number;
  /** What the policy learned from measured times to first token (0 until it has; see {@link PrefillCostModel}). */
  readonly prefillCost: { readonly secondsPerBlock: number; readonly blocksPerLoad: number };
}
