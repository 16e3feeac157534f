import type { IncomingMessage } from 'node:http';
import type { DecisionSource, UpstreamErrorKind } from '../types';
import type { MeteredEndpoint, RouterMetrics } from './metrics';

/** What the metrics read of a request: where its rank came from and when it was dispatched. */
interface MeteredRoute {
  readonly source: DecisionSource;
  readonly started: number;
}

/** The per-endpoint metrics on the request's way (request/route-hooks.ts): dispatched, a failed try, a 5xx answer, the first token, the duration. */
export function metricHooks(metrics: RouterMetrics) {
  return {
    name: 'metrics',
    held(route: MeteredRoute, endpoint: MeteredEndpoint): void {
      metrics.dispatched(endpoint, route.source);
    },
    failed(_route: MeteredRoute, endpoint: MeteredEndpoint, _req: IncomingMessage, kind: UpstreamErrorKind): void {
      metrics.upstreamError(endpoint, kind);
    },
    answered(_route: MeteredRoute, endpoint: MeteredEndpoint, _req: IncomingMessage, _res: unknown, answer: IncomingMessage): void {
      if (answer.statusCode !== undefined && answer.statusCode >= 500) metrics.upstreamError(endpoint, 'status_5xx');
    },
    firstToken(_route: MeteredRoute, endpoint: MeteredEndpoint, seconds: number): void {
      metrics.firstToken(endpoint, seconds);
    },
    closed(route: MeteredRoute, endpoint: MeteredEndpoint): void {
      metrics.finished(endpoint, (performance.now() - route.started) / 1000);
    },
  };
}
