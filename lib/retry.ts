import type { IncomingMessage, ServerResponse } from 'node:http';
import { hasBody } from './body';
import type { EndpointTable, RouteEndpoint } from './endpoints';
import type { RouterMetrics } from './metrics';
import type { Configuration } from './options';
import type { ProxiedRequest } from './proxy';
import { RankDecision, routeOf } from './route-state';
import type { DecisionSource, PickContext } from './types';

/** Starts one try of `req` at the endpoint its state holds. */
export type SendAttempt = (req: ProxiedRequest, res: ServerResponse) => void;

/** The headers http-proxy's `xfwd` appends to on every try. */
const FORWARDED_APPENDED = ['x-forwarded-for', 'x-forwarded-port', 'x-forwarded-proto'] as const;

/**
 * Decides and starts retries on another upstream: a refused or reset connection belongs to the
 * API server, which all the ranks it serves share, so the endpoints of an upstream URL that
 * failed are not tried again for this request. The policy picks among the healthy endpoints
 * left; a hint goes to the least loaded replica of the same rank elsewhere. The in-flight
 * slot, `req.dpRank`, the chosen endpoint and the rank header move to the new endpoint; the
 * body is replayed from the buffer. Returns false when the request must not or cannot be
 * retried, and the caller answers the error.
 */
export function createRetry(config: Configuration, table: EndpointTable, metrics: RouterMetrics, send: SendAttempt) {
  const { header, policy, retryAttempts } = config;
  return function retry(req: ProxiedRequest, res: ServerResponse, failed: RouteEndpoint): boolean {
    const route = routeOf(req)!;
    if (route.attempt >= retryAttempts || res.headersSent) return false;
    // Only what can be replayed byte for byte: a buffered body, or none at all.
    if (route.body === undefined && hasBody(req)) return false;
    const tried = (route.tried ??= []);
    tried.push(failed);
    const source: DecisionSource = req.dpRank!.source;
    const next = source === 'hint' ? otherReplica(failed.rank, tried) : pickAnother(req, route.context, tried);
    if (next === undefined) return false;
    metrics.retried(failed);
    config.tracing.retried(req, failed, next);
    config.logger.retried(failed, next);

    failed.inflight--;
    next.inflight++;
    metrics.dispatched(next, source);
    route.endpoint = next;
    route.carryRank(req, next);
    req.dpRank = new RankDecision(next, source, route);
    if (next.headerValue !== undefined) req.headers[header] = next.headerValue;
    else delete req.headers[header];
    if (config.exposeDecision) res.setHeader('x-dp-router-decision', next.receipts[source]);
    undoForwardedHeaders(req);
    route.attempt++;
    send(req, res);
    return true;
  };

  function otherReplica(rank: number, tried: readonly RouteEndpoint[]): RouteEndpoint | undefined {
    let best: RouteEndpoint | undefined;
    for (const replica of table.healthyOfRank(rank)) {
      if (failedBefore(replica, tried)) continue;
      if (best === undefined || replica.load < best.load) best = replica;
    }
    return best;
  }

  function pickAnother(req: ProxiedRequest, picked: PickContext | undefined, tried: readonly RouteEndpoint[]): RouteEndpoint | undefined {
    const candidates = table.healthy().filter((endpoint) => !failedBefore(endpoint, tried));
    if (candidates.length === 0) return undefined;
    const context: PickContext = picked ?? { path: req.url ?? '/', affinityKey: undefined, prompt: undefined };
    try {
      const chosen = policy.pick(candidates, context) as RouteEndpoint;
      return candidates.includes(chosen) ? chosen : undefined;
    } catch {
      // The policy's fault surfaces on first picks; a retry answers the upstream's error instead.
      return undefined;
    }
  }
}

/** Whether the endpoint's upstream server already failed this request. */
function failedBefore(endpoint: RouteEndpoint, tried: readonly RouteEndpoint[]): boolean {
  for (const failed of tried) if (failed.config.url === endpoint.config.url) return true;
  return false;
}

/** Removes the values http-proxy appended on the failed try, so the next one appends once. */
function undoForwardedHeaders(req: IncomingMessage): void {
  for (const name of FORWARDED_APPENDED) {
    const value = req.headers[name];
    if (typeof value !== 'string') continue;
    const comma = value.lastIndexOf(',');
    if (comma === -1) delete req.headers[name];
    else req.headers[name] = value.slice(0, comma);
  }
}
