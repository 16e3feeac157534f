import type { FirstTokenCounts } from '../observe/first-event';

/**
 * First-token learning (a policy that `learnsFirstTokens`) on the request's way
 * (request/route-hooks.ts): a streamed answer's first token joins its endpoint's totals. A
 * non-streamed answer's first byte comes with its last, which says how long the generation
 * took, not how long the prefill waited: not counted.
 */
export function firstTokenLearning() {
  return {
    name: 'first-token-learning',
    firstToken(_route: unknown, endpoint: FirstTokenCounts, seconds: number, streamed: boolean): void {
      if (!streamed) return;
      endpoint.firstTokens++;
      endpoint.firstTokenSeconds += seconds;
    },
  };
}
