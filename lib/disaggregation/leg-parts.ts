import type { RouterLogger } from '../observe/logger';
import type { TimeoutConfig } from '../http/timeout-options';
import type { RetryConfig } from '../forward/retry-options';
import type { HintConfig } from '../request/hint-options';
import type { RouterEvents } from '../observe/events';
import type { RouterMetrics } from '../observe/metrics';
import type { ExactLookup } from '../policies/exact-pick';
import type { RoutePolicy } from '../policies/route-policy';
import type { EndpointTable } from '../upstreams/endpoints';
import type { OutlierDetector } from '../upstreams/outlier-detector';
import type { RankHeaderGuard } from '../upstreams/rank-header-guard';
import type { RequestInputs } from '../request/request-inputs';
import type { RouteEndpoint } from '../upstreams/endpoints';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import type { DisaggregationMetrics } from './metrics';
import type { DisaggregationConfig } from './options';
import type { PrefillClient } from './prefill-client';

/** The options the terminal reads (the router's `Configuration` is one). */
export interface DisaggregationRouterConfig {
  readonly disaggregation: DisaggregationConfig | undefined;
  readonly header: string;
  readonly hints: HintConfig;
  readonly exposeDecision: boolean;
  readonly maxBodyBytes: number;
  readonly xfwd: false | 'replace' | 'append';
  readonly retries: RetryConfig;
  readonly timeouts: TimeoutConfig;
  readonly logger: RouterLogger;
}

/** The prefill leg's pool, built by the composition root (`compose/prefill-pool.ts`). */
export interface PrefillLeg {
  readonly policy: RoutePolicy;
  readonly table: EndpointTable;
  readonly metrics: RouterMetrics;
  readonly events: RouterEvents;
  readonly exact: ExactLookup | undefined;
  readonly detector: OutlierDetector | undefined;
  readonly inputs: RequestInputs;
  readonly legMetrics: DisaggregationMetrics | undefined;
  /** Told of a prefill server's refusal of the rank header it was sent (upstreams/rank-header-guard.ts). */
  readonly rankHeaders: Pick<RankHeaderGuard, 'refused'>;
  clientOf(endpoint: RouteEndpoint): PrefillClient;
  /** `setUpstreams()`: the prefill entries, those found by DNS resolved by the pool. */
  setSources(sources: readonly UpstreamConfig[]): void;
  close(): Promise<void>;
}
