import type { IncomingMessage, ServerResponse } from 'node:http';
import { createUpstreamProxy } from './proxy';
import { CHOSEN_ENDPOINT, type RoutedRequest } from './rank-handler';
import { createRouting, type Middleware, type RoutingHelpers } from './routing';
import type { Options } from './types';

/** The router: Express middleware with its metrics handler, registry, snapshot and `close()`. */
export type DpRouter = Middleware & RoutingHelpers;

/**
 * Routes each request to a vLLM data-parallel rank and proxies it there with exactly one
 * clean rank header.
 *
 * @example
 * const router = dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 8 }] });
 * app.get('/metrics', router.metrics);
 * app.use(router);
 */
export function dpRouter(options: Options): DpRouter {
  const routing = createRouting(options);
  const proxies = routing.config.upstreams.map((upstream) => createUpstreamProxy(upstream, routing.config, routing.metrics));
  routing.onClose.push(() => proxies.forEach((proxy) => proxy.close()));
  const { handle } = routing;

  function dpRouterMiddleware(req: IncomingMessage, res: ServerResponse, next: (error?: unknown) => void): void {
    const routed = req as RoutedRequest;
    handle(routed, res, (error) => {
      if (error !== undefined) {
        next(error);
        return;
      }
      // Express strips the mount path from req.url; upstream must see the path the client sent.
      if (routed.originalUrl !== undefined) routed.url = routed.originalUrl;
      proxies[routed[CHOSEN_ENDPOINT]!.config.index].handle(routed, res, next);
    });
  }
  return Object.assign(dpRouterMiddleware, routing.helpers);
}
