import { dpRouter } from './dp-router';

export { dpRouter } from './dp-router';
export type { DpRouter } from './dp-router';
export { dpRank } from './dp-rank';
export type { DpRank } from './dp-rank';
export { parseRankHint } from './hint';
export type { RankHintResult } from './hint';
export { leastOutstanding } from './policies/least-outstanding';
export { roundRobin } from './policies/round-robin';
export { random } from './policies/random';
export { powerOfTwo } from './policies/power-of-two';
export type { RandomSource } from './policies/random';
export { sessionAffinity } from './policies/session-affinity';
export type { SessionAffinityOptions } from './policies/session-affinity';
export { prefixAware } from './policies/prefix-aware';
export type { PrefixAwareOptions } from './policies/prefix-aware';
export { extractPrompt } from './prompt';
export type { Middleware, RoutingHelpers } from './routing';
export type * from './types';

export default dpRouter;
