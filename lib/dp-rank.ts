import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import { withoutNomination } from './hop-by-hop';
import type { RouteState, RoutedRequest } from './route-state';
import type { DpRankOptions } from './options';
import { createRouting, type Middleware, type RoutingHelpers } from './routing';

/** `dpRank()`'s middleware: decides the rank and leaves the proxying to you. */
export type DpRank = Middleware & RoutingHelpers;

/**
 * Hint handling and rank assignment without the proxy, for a gateway that has its own:
 * sets `req.dpRank` (with the chosen upstream's `url`), rewrites the rank header in
 * `req.headers` so any proxy that forwards request headers sends exactly one clean copy, and
 * holds the in-flight slot until the response closes.
 *
 * @example
 * app.use(dpRank({ upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 8 }] }));
 * app.use(createProxyMiddleware({ router: (req) => req.dpRank!.url }));
 */
export function dpRank(options: DpRankOptions): DpRank {
  const routing = createRouting(
    options,
    (req, res, next, route) => {
      keepRankHeader(req.headers, routing.config.header);
      handOn(req, res, next, route);
    },
    'dpRank',
  );
  return Object.assign(routing.handle, routing.helpers);
}

/**
 * A proxy that follows RFC 9110 removes every header the `Connection` header names: a client
 * naming the rank header there would have the router's header dropped on the way.
 */
function keepRankHeader(headers: IncomingHttpHeaders, header: string): void {
  const connection = headers.connection;
  if (connection === undefined || connection === 'keep-alive' || connection === 'close') return;
  const left = withoutNomination(connection, header);
  if (left === connection) return;
  if (left === undefined) delete headers.connection;
  else headers.connection = left;
}

function handOn(req: RoutedRequest & { _body?: boolean }, _res: ServerResponse, next: (error?: unknown) => void, route: RouteState): void {
  const bytes = route.body;
  // A body parsed before the router holds the client's hint field: hand on the rewritten one.
  if (bytes !== undefined && (req.body === undefined || route.hintFields !== undefined)) {
    // The body had to be read here (body hints, prefix-aware, a body affinity key), so the
    // stream is spent: leave it parsed as express.json() would, for the caller's proxy to
    // forward (http-proxy-middleware's fixRequestBody, express-http-proxy). `_body` tells a
    // later body-parser 1.x (Express 4) not to wait for a stream that has ended. The router
    // read it as valid JSON (or encoded the parser's result), with any hint field already
    // carrying the chosen rank.
    req.body = JSON.parse(bytes.toString('utf8'));
    req._body = true;
    route.body = undefined;
  }
  next();
}
