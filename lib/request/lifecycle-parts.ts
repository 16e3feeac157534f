import type { ServerResponse } from 'node:http';
import type { Gate } from './gate';
import type { ExactLookup } from '../policies/exact-pick';
import type { RouterEvents } from '../observe/events';
import type { RouterMetrics } from '../observe/metrics';
import type { Tracing } from '../observe/tracing';
import type { RouterLogger } from '../observe/logger';
import type { TimeoutConfig } from '../http/timeout-options';
import type { HintConfig } from './hint-options';
import type { BufferingConfig } from './buffering-options';
import type { ModelStage } from './model-stage';
import type { RoutePolicy } from '../policies/route-policy';
import type { EndpointTable } from '../upstreams/endpoints';
import type { BodyReader, Next } from './body-reader';
import type { RequestInputs } from './request-inputs';
import type { RouteState, RoutedRequest } from './route-state';
import type { RouteSeam } from './route-hooks';
import type { VllmBalancing } from './vllm-balancing';

/**
 * What follows a decision, injected at construction: dpRank's hand-on to the next middleware,
 * or dpRouter's forwarder. When `proceed` is called `req.dpRank` and the rank header are set and
 * `route` holds the endpoint (its slot is released when the response closes, whatever the
 * terminal does).
 */
export interface Terminal {
  proceed(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void;
  /**
   * The request goes on to other code (dpRank's caller), which may expect a body the router
   * read to have ended (`req.readableEnded`, as http-proxy-middleware's `fixRequestBody` does):
   * such a body is read to its end, never taken from the buffer ahead of it.
   */
  readonly handsOn?: boolean;
  /** Stops what the terminal owns (sockets, agents); the router's `close()` calls it first. */
  close(): void;
}

/** The options a lifecycle reads (the router's `Configuration` is one). */
export interface LifecycleConfig {
  readonly header: string;
  readonly hints: HintConfig;
  readonly exposeDecision: boolean;
  readonly maxBodyBytes: number;
  readonly requestBuffering: BufferingConfig;
  readonly timeouts: Pick<TimeoutConfig, 'bodyMs'>;
  readonly logger: RouterLogger;
}

/** The parts a lifecycle works with, built once per router before it. */
export interface LifecycleParts {
  readonly config: LifecycleConfig;
  readonly policy: RoutePolicy;
  readonly events: RouterEvents;
  /** Whether tracing records anything (`@opentelemetry/api` installed). */
  readonly tracing: Tracing;
  readonly table: EndpointTable;
  readonly metrics: RouterMetrics;
  readonly inputs: RequestInputs;
  readonly bodies: BodyReader;
  /** Exact prefix routing, with a tokenizer and upstreams with `kvEvents`. */
  readonly exact: ExactLookup | undefined;
  /** Pools by model and the `GET /v1/models` union. */
  readonly models: ModelStage;
  /** Admission control; `undefined` when off. */
  readonly admission: Gate | undefined;
  /** Where requests go that vLLM balances itself. */
  readonly balancing: VllmBalancing;
  /** What the features do at each point of the way (route-hooks.ts). */
  readonly hooks: RouteSeam<RouteState>;
}
