import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { RouteEndpoint } from './endpoints';
import type { OutlierDetector } from './outlier-detector';
import type { RankHeaderGuard } from './rank-header-guard';
import { watchRankRejection } from './rank-rejection';

/** What the guard and the detector read of a request: who sent it (lib/verdicts/source.ts). */
interface EvidenceRoute {
  readonly headers: IncomingHttpHeaders;
  /** Admission's ticket: the tenant it resolved. */
  readonly ticket?: { readonly tenant: string } | undefined;
}

/**
 * The rank-header guard on the request's way (request/route-hooks.ts): an answer that refuses
 * the rank header sent is told to it, with who sent the request; any other answer of an
 * upstream whose refusal it holds may carry the probe that lifts it.
 */
export function rankHeaderHooks(guard: RankHeaderGuard) {
  return {
    name: 'rank-header-guard',
    answered(route: EvidenceRoute, endpoint: RouteEndpoint, req: IncomingMessage, _res: unknown, answer: IncomingMessage): void {
      if (endpoint.headerValue !== undefined) watchRankRejection(answer, (refused, numRanks) => guard.refused(endpoint, refused, numRanks, req, route.headers, route.ticket?.tenant));
      else guard.answered(endpoint, route.headers);
    },
  };
}

/**
 * Passive outlier detection on the request's way: a half-open endpoint's trial is watched; a
 * failed try, and a 5xx answer, count against its endpoint;
 * any answer below 500, a 4xx included, shows it alive (a client's bad request is never the
 * endpoint's fault).
 */
export function outlierHooks(detector: OutlierDetector) {
  return {
    name: 'outlier-detection',
    sending(_route: unknown, endpoint: RouteEndpoint, res: ServerResponse): void {
      // This request is the half-open endpoint's one trial; if the client leaves before it
      // decides, the endpoint must be free for another trial.
      if (detector.dispatched(endpoint, res)) res.once('close', () => detector.abandoned(endpoint, res));
    },
    failed(route: EvidenceRoute, endpoint: RouteEndpoint, req: IncomingMessage, _kind: string, origin: 'request' | 'connection'): void {
      detector.failed(endpoint, origin, req, route.ticket?.tenant);
    },
    answered(route: EvidenceRoute, endpoint: RouteEndpoint, req: IncomingMessage, _res: unknown, answer: IncomingMessage): void {
      if (answer.statusCode !== undefined && answer.statusCode >= 500) detector.failed(endpoint, 'request', req, route.ticket?.tenant);
      else detector.succeeded(endpoint);
    },
  };
}
