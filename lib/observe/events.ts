import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import type { RouterLogger } from './logger';
import type { RouterMetrics } from './metrics';
import type { Tracing } from './tracing';
import type { DecisionSource, Endpoint, HintOutcome, IndexSource } from '../types';
import { logHealthChange, type HealthRule } from './health-log';

/**
 * What happens to requests and endpoints, told once by whoever sees it; {@link createEvents}
 * fans each event out to metrics, tracing and logs. (Counts only metrics keep, such as a
 * request's dispatch and end, go to the metrics directly.)
 */
export interface RouterEvents {
  /** A request took its first endpoint (`hintOutcome`: what became of its hint, if it had one; `headers`: `req.headers`, read already). */
  decided(req: IncomingMessage, endpoint: Endpoint, source: DecisionSource, hintOutcome: HintOutcome | undefined, headers: IncomingHttpHeaders): void;
  /** The policy scored the pick on `index`, estimating the chosen endpoint holds `matchedShare` of the prompt. */
  prefixScored(req: IncomingMessage, index: IndexSource, matchedShare: number): void;
  /** The request is sent again, to `next`, after `failed` failed it. */
  retried(req: IncomingMessage, failed: Endpoint & Parameters<RouterMetrics['retried']>[0], next: Endpoint): void;
  /** The outlier detector took `endpoint` out of rotation. */
  ejected(endpoint: Endpoint & Parameters<RouterMetrics['ejected']>[0]): void;
  /** The health checks' verdict on one upstream URL changed (`up`), for every endpoint behind it. */
  healthChanged(endpoints: readonly Endpoint[], up: boolean): void;
}

/**
 * The one composite: each event goes to every sink that records it. `healthCheck` words the
 * health lines (the rule that was met); without it no health change is told.
 */
export function createEvents(metrics: RouterMetrics, tracing: Tracing, logger: RouterLogger, policy: string, healthCheck: HealthRule | undefined): RouterEvents {
  // Told on every request: with neither tracing nor a logger that writes per-request lines, nothing at all.
  const decided: RouterEvents['decided'] =
    tracing.enabled || logger.perRequest
      ? (req, endpoint, source, hintOutcome, headers) => {
          tracing.decided(req, endpoint, source, hintOutcome, headers);
          logger.decided(endpoint, source, policy, hintOutcome);
        }
      : () => undefined;
  return {
    decided,
    prefixScored(req, index, matchedShare) {
      tracing.prefixScored(req, index, matchedShare);
    },
    retried(req, failed, next) {
      metrics.retried(failed);
      tracing.retried(req, failed, next);
      logger.retried(failed, next);
    },
    ejected(endpoint) {
      metrics.ejected(endpoint);
      tracing.ejected(endpoint);
      logger.ejected(endpoint);
    },
    healthChanged(endpoints, up) {
      if (healthCheck !== undefined) logHealthChange(logger, healthCheck, endpoints, up);
    },
  };
}
