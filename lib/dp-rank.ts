import { createRouting, type Middleware, type RoutingHelpers } from './routing';
import type { Options } from './types';

/** `dpRank()`'s middleware: decides the rank and leaves the proxying to you. */
export type DpRank = Middleware & RoutingHelpers;

/**
 * Hint handling and rank assignment without the proxy, for a gateway that has its own:
 * sets `req.dpRank`, rewrites the rank header in `req.headers`, and holds the in-flight
 * slot until the response closes.
 *
 * @example
 * app.use(dpRank({ upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 8 }] }));
 * app.use((req, res, next) => myProxy(req.dpRank.url)(req, res, next));
 */
export function dpRank(options: Options): DpRank {
  const routing = createRouting(options);
  const { handle } = routing;
  function dpRankMiddleware(req: Parameters<Middleware>[0], res: Parameters<Middleware>[1], next: Parameters<Middleware>[2]): void {
    handle(req, res, next);
  }
  return Object.assign(dpRankMiddleware, routing.helpers);
}
