import { parseOptions, type DpRankOptions } from './options';
import { HandOn } from './request/hand-on';
import { RequestLifecycle } from './request/lifecycle';
import { routerOf, type Middleware, type RoutingHelpers } from './routing';
import { RouterServices } from './compose/services';

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
  const config = parseOptions(options, 'dpRank');
  const services = new RouterServices(config);
  const handOn = new HandOn(config.header);
  const lifecycle = new RequestLifecycle(services, handOn);
  return routerOf(services, lifecycle, handOn);
}
