import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { readBody } from './body';
import { sendError } from './errors';
import { startHealthChecks } from './health-checker';
import { hopByHopStripper } from './hop-by-hop';
import { OutlierDetector } from './outlier-detector';
import type { RouteEndpoint } from './endpoints';
import { createUpstreamProxy, WAITING, type ProxiedRequest, type UpstreamProxy } from './proxy';
import { routeOf, type RouteState } from './route-state';
import { createRetry } from './retry';
import { createRouting, type Middleware, type RoutingHelpers } from './routing';
import type { DpRouterOptions, UpstreamConfig } from './options';

/** The router: Express middleware with its metrics handler, registry, snapshot and `close()`. */
export type DpRouter = Middleware & RoutingHelpers;

/**
 * Routes each request to a vLLM data-parallel rank and proxies it there with exactly one
 * clean rank header. Endpoints that keep failing are ejected for a while, failed connections
 * are retried on another endpoint, and upstreams can be health-checked.
 *
 * @example
 * const router = dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 8 }] });
 * app.get('/metrics', router.metrics);
 * app.use(router);
 */
export function dpRouter(options: DpRouterOptions): DpRouter {
  const routing = createRouting(options, proxyDecided, 'dpRouter');
  const { config, table, metrics } = routing;
  const ejections = {
    ejected(endpoint: RouteEndpoint): void {
      metrics.ejected(endpoint);
      config.tracing.ejected(endpoint);
      config.logger.ejected(endpoint);
    },
  };
  const detector = config.outlierDetection ? new OutlierDetector(table, config.outlierDetection, ejections) : undefined;
  const retry = config.retryAttempts > 1 ? createRetry(config, table, metrics, (req, res) => send(req, res, (error) => answerProxyFailure(res, error), routeOf(req)!)) : undefined;
  // One proxy (and keep-alive agent) per upstream, by name; a replaced one is kept until close()
  // so that requests in flight through it finish.
  const proxies = new Map<string, UpstreamProxy>();
  const retired: UpstreamProxy[] = [];
  // Endpoints kept across a reconfiguration hold the configuration they were built with.
  const proxyOf = new WeakMap<UpstreamConfig, UpstreamProxy>();
  const proxyFor = (upstream: UpstreamConfig) => `${upstream.name}\n${upstream.url}`;
  const syncProxies = () => {
    const wanted = new Set(table.upstreams.map(proxyFor));
    for (const [key, proxy] of proxies) {
      if (wanted.has(key)) continue;
      proxies.delete(key);
      retired.push(proxy);
    }
    for (const upstream of table.upstreams) {
      if (!proxies.has(proxyFor(upstream))) proxies.set(proxyFor(upstream), createUpstreamProxy(upstream, config, metrics, { detector, retry }));
    }
    for (const endpoint of table.all) proxyOf.set(endpoint.config, proxies.get(proxyFor(endpoint.config))!);
  };
  syncProxies();
  let health = config.healthCheck ? startHealthChecks(table, config.healthCheck) : undefined;
  routing.onReconfigure.push(() => {
    syncProxies();
    if (config.healthCheck) {
      health?.stop();
      health = startHealthChecks(table, config.healthCheck);
    }
  });
  routing.onClose.push(() => {
    health?.stop();
    detector?.close();
    for (const proxy of [...proxies.values(), ...retired]) proxy.close();
  });
  // A retry goes to another upstream server: with one server there is nowhere to retry, and
  // holding bodies for it would only cost memory and latency.
  let retryBodyLimit = 0;
  const syncRetryLimit = () => {
    const servers = new Set(table.upstreams.map((upstream) => upstream.url)).size;
    retryBodyLimit = retry !== undefined && servers > 1 ? config.retryMaxBodyBytes : 0;
  };
  syncRetryLimit();
  routing.onReconfigure.push(syncRetryLimit);
  const { header } = config;
  // The router's own rank header, set already, survives a client's `Connection` nomination.
  const stripHopByHop = hopByHopStripper([header]);
  const replaceForwarded = config.xfwd === 'replace';

  /** Starts one try at the chosen endpoint. */
  function send(req: ProxiedRequest, res: ServerResponse, next: (error?: unknown) => void, route: RouteState): void {
    const endpoint = route.endpoint!;
    route.phase = WAITING;
    if (detector?.dispatched(endpoint, res)) {
      // This request is the half-open endpoint's one trial; if the client leaves before it
      // decides, the endpoint must be free for another trial.
      res.once('close', () => detector.abandoned(endpoint, res));
    }
    proxyOf.get(endpoint.config)!.handle(req, res, next);
  }

  function proxyDecided(req: ProxiedRequest, res: ServerResponse, next: (error?: unknown) => void, route: RouteState): void {
    // Express strips the mount path from req.url; upstream must see the path the client sent.
    if (req.originalUrl !== undefined) req.url = req.originalUrl;
    const { headers } = req;
    if (headers.upgrade !== undefined && WEBSOCKET.test(headers.upgrade)) {
      // Stripped like any hop-by-hop header, the upgrade would reach the engine as a plain
      // request to a WebSocket-only route and come back as a puzzling 404 or 403.
      sendError(res, 501, 'NotImplementedError', 'The gateway does not proxy WebSocket upgrades; connect to the vLLM server directly for WebSocket endpoints.', 'upgrade');
      return;
    }
    stripHopByHop(headers);
    if (replaceForwarded) dropForwarded(headers);
    // Hold the body so that a retry can replay it; the limit bounds what one request holds, the
    // body budget what all do. Past the budget the body is streamed and the request not retried.
    const lease = retryBodyLimit > 0 && route.body === undefined && replayableSize(req, retryBodyLimit) ? route.leaseFrom(config.bodyBudget, res) : undefined;
    if (lease !== undefined && lease.grow(Number(req.headers['content-length']))) {
      readBody(req, retryBodyLimit).then((result) => {
        if (!result.ok) {
          // Cannot happen with a declared length (Node enforces it); the client left otherwise,
          // and its slot is released on close.
          if (result.failure === 'too_large') sendError(res, 413, 'RequestEntityTooLargeError', 'Request body exceeds its Content-Length.');
          return;
        }
        route.body = result.bytes;
        // The client may have left while its body arrived.
        if (res.destroyed) return;
        send(req, res, next, route);
      }, next);
      return;
    }
    send(req, res, next, route);
  }
  return Object.assign(routing.handle, routing.helpers);
}

/**
 * Whether the body is worth holding for retries: declared by `Content-Length` (so its size is
 * known before a byte is read), not empty, within the limit, and still unread.
 */
function replayableSize(req: IncomingMessage, limit: number): boolean {
  if (req.readableEnded || req.headers['transfer-encoding'] !== undefined) return false;
  const declared = req.headers['content-length'];
  if (declared === undefined || declared === '0') return false;
  const size = Number(declared);
  return size > 0 && size <= limit;
}

const WEBSOCKET = /(?:^|[\s,])websocket(?:$|[\s,/])/i;

/** What a client claims about earlier hops; http-proxy then sets the gateway's own view. */
const FORWARDED = ['forwarded', 'x-forwarded-for', 'x-forwarded-host', 'x-forwarded-port', 'x-forwarded-proto'] as const;

function dropForwarded(headers: IncomingHttpHeaders): void {
  for (const name of FORWARDED) if (headers[name] !== undefined) delete headers[name];
}

/**
 * http-proxy-middleware failed before proxying a retry (it calls `next` only on its own
 * errors). The first try's `next` belongs to Express and has been handed on; answer here.
 */
function answerProxyFailure(res: ServerResponse, error?: unknown): void {
  if (error === undefined) return;
  sendError(res, 502, 'BadGatewayError', 'The request could not be proxied to another upstream.');
}
