import type { IncomingMessage, ServerResponse } from 'node:http';
import { readBody } from './body';
import { sendError } from './errors';
import { startHealthChecks } from './health-checker';
import { OutlierDetector } from './outlier-detector';
import { ATTEMPT, createUpstreamProxy, PHASE, WAITING, type ProxiedRequest, type UpstreamProxy } from './proxy';
import { BUFFERED_BODY, CHOSEN_ENDPOINT } from './rank-handler';
import { createRetry } from './retry';
import { createRouting, type Middleware, type RoutingHelpers } from './routing';
import type { Options } from './types';

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
export function dpRouter(options: Options): DpRouter {
  const routing = createRouting(options);
  const { config, table, metrics, handle } = routing;
  const detector = config.outlierDetection ? new OutlierDetector(table, config.outlierDetection) : undefined;
  const retry = config.retryAttempts > 1 ? createRetry(config, table, metrics, (req, res) => send(req, res, (error) => answerProxyFailure(res, error))) : undefined;
  const proxies: UpstreamProxy[] = config.upstreams.map((upstream) => createUpstreamProxy(upstream, config, metrics, { detector, retry }));
  const health = config.healthCheck ? startHealthChecks(table, config.healthCheck) : undefined;
  routing.onClose.push(() => {
    health?.stop();
    detector?.close();
    proxies.forEach((proxy) => proxy.close());
  });
  const retryBodyLimit = retry === undefined ? 0 : config.retryMaxBodyBytes;

  /** Starts one try at the chosen endpoint. */
  function send(req: ProxiedRequest, res: ServerResponse, next: (error?: unknown) => void): void {
    if (res.destroyed) return;
    const endpoint = req[CHOSEN_ENDPOINT]!;
    req[PHASE] = WAITING;
    if (detector?.dispatched(endpoint, res)) {
      // This request is the half-open endpoint's one trial; if the client leaves before it
      // decides, the endpoint must be free for another trial.
      res.once('close', () => detector.abandoned(endpoint, res));
    }
    proxies[endpoint.config.index].handle(req, res, next);
  }

  function dpRouterMiddleware(req: IncomingMessage, res: ServerResponse, next: (error?: unknown) => void): void {
    const routed = req as ProxiedRequest;
    handle(routed, res, (error) => {
      if (error !== undefined) {
        next(error);
        return;
      }
      // Express strips the mount path from req.url; upstream must see the path the client sent.
      if (routed.originalUrl !== undefined) routed.url = routed.originalUrl;
      routed[ATTEMPT] = 1;
      if (retryBodyLimit > 0 && routed[BUFFERED_BODY] === undefined && replayableSize(routed, retryBodyLimit)) {
        // Hold the body so that a retry can replay it; the limit bounds what is held.
        readBody(routed, retryBodyLimit).then((result) => {
          if (!result.ok) {
            // Cannot happen with a declared length (Node enforces it); the client left otherwise,
            // and its slot is released on close.
            if (result.failure === 'too_large') sendError(res, 413, 'RequestEntityTooLargeError', 'Request body exceeds its Content-Length.');
            return;
          }
          routed[BUFFERED_BODY] = result.bytes;
          send(routed, res, next);
        }, next);
        return;
      }
      send(routed, res, next);
    });
  }
  return Object.assign(dpRouterMiddleware, routing.helpers);
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

/**
 * http-proxy-middleware failed before proxying a retry (it calls `next` only on its own
 * errors). The first try's `next` belongs to Express and has been handed on; answer here.
 */
function answerProxyFailure(res: ServerResponse, error?: unknown): void {
  if (error === undefined) return;
  sendError(res, 502, 'BadGatewayError', 'The request could not be proxied to another upstream.');
}
