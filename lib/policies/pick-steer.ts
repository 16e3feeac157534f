import type { Endpoint } from '../types';

/**
 * What a feature that takes the pick from the prefix-aware policy's estimates gives it in the pick
 * context (`ctx.slo`, SLO routing: lib/slo): arrays it fills per candidate, then the choice.
 */
export interface PickSteer {
  readonly estimates: {
    /** Grows the arrays to `count` candidates (they may be new arrays after). */
    ensure(count: number): void;
    /** The prompt's blocks the candidate lacks (its own prefill). */
    readonly uncached: Float64Array;
    /** Prefill queued ahead of the request there, in the same blocks. */
    readonly ahead: Float64Array;
    /** Requests in flight there (its load). */
    readonly load: Float64Array;
    /** The policy's own cost (lower is better). */
    readonly cost: Float64Array;
  };
  /** The candidate to take (the policy's own choice was `bestAt`), or −1: none (the request is answered without one). */
  steer(candidates: readonly Endpoint[], count: number, bestAt: number): number;
}
