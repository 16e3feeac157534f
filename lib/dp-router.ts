import { DisaggregatedTerminal } from './disaggregation/terminal';
import { Forwarder } from './forward/forwarder';
import { parseOptions, type DpRouterOptions } from './options';
import { RequestLifecycle } from './request/lifecycle';
import { routerOf, type Middleware, type RoutingHelpers } from './routing';
import { RouterServices } from './compose/services';
import { PrefillPool } from './compose/prefill-pool';

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
  const config = parseOptions(options, 'dpRouter');
  const services = new RouterServices(config);
  const forwarder = new Forwarder(services);
  // With `disaggregation`, generations split into a prefill leg and the forwarder's decode leg.
  const terminal = config.disaggregation ? new DisaggregatedTerminal(services, forwarder, new PrefillPool(config, services.registry, services.tracing, (model) => services.models.pools.isAdapter(model))) : forwarder;
  const lifecycle = new RequestLifecycle(services, terminal);
  return routerOf(services, lifecycle, terminal);
}
