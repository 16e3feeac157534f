import { startHealthChecks } from './upstreams/health-checker';
import { OutlierDetector } from './upstreams/outlier-detector';
import type { RouteEndpoint } from './upstreams/endpoints';
import { createForwarding } from './pipeline';
import { createUpstreamProxy, type UpstreamProxy } from './forward/proxy';
import { createRouting, type Middleware, type RoutingHelpers } from './routing';
import type { DpRouterOptions, UpstreamConfig } from './options';
import { DisaggregatedTerminal } from './disaggregation/terminal';

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
  // The request path is in pipeline.ts; this sets up what its proxying end works with.
  const routing = createRouting(options, (req, res, next, route) => (split ?? forwarding).proceed(req, res, next, route), 'dpRouter');
  const { config, table, metrics, pipeline } = routing;
  const ejections = {
    ejected(endpoint: RouteEndpoint): void {
      metrics.ejected(endpoint);
      config.tracing.ejected(endpoint);
      config.logger.ejected(endpoint);
    },
  };
  const detector = config.outlierDetection ? new OutlierDetector(table, config.outlierDetection, ejections) : undefined;
  // One proxy (and keep-alive agent) per upstream, by name; a replaced one is kept until close()
  // so that requests in flight through it finish.
  const proxies = new Map<string, UpstreamProxy>();
  const retired: UpstreamProxy[] = [];
  // Endpoints kept across a reconfiguration hold the configuration they were built with.
  const proxyOf = new WeakMap<UpstreamConfig, UpstreamProxy>();
  const forwardingParts = createForwarding({ config, table, metrics, pipeline, detector, proxyOf: (endpoint) => proxyOf.get(endpoint.config)! });
  const forwarding = { ...forwardingParts, proceed: forwardingParts.forward, close: () => undefined };
  const split = config.disaggregation
    ? new DisaggregatedTerminal(config, routing.helpers.registry, { read: (req, res, route, _limit, purpose, next, then) => pipeline.readBody(req, res, route, purpose, next, then) }, forwarding)
    : undefined;
  if (split) routing.onClose.push(() => split.close());
  const proxyKey = (upstream: UpstreamConfig) => `${upstream.name}\n${upstream.url}`;
  const syncProxies = () => {
    const wanted = new Set(table.upstreams.map(proxyKey));
    for (const [key, proxy] of proxies) {
      if (wanted.has(key)) continue;
      proxies.delete(key);
      retired.push(proxy);
    }
    for (const upstream of table.upstreams) {
      if (!proxies.has(proxyKey(upstream))) proxies.set(proxyKey(upstream), createUpstreamProxy(upstream, config, forwarding.outcomes));
    }
    for (const endpoint of table.all) proxyOf.set(endpoint.config, proxies.get(proxyKey(endpoint.config))!);
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
  const syncRetryLimit = () => {
    const servers = new Set(table.upstreams.map((upstream) => upstream.url)).size;
    pipeline.setRetryBodyLimit(config.retryAttempts > 1 && servers > 1 ? config.retryMaxBodyBytes : 0);
  };
  syncRetryLimit();
  routing.onReconfigure.push(syncRetryLimit);
  const helpers = split ? { ...routing.helpers, endpoints: () => [...routing.helpers.endpoints(), ...split.pool.table.snapshot().map((endpoint) => ({ ...endpoint, leg: 'prefill' as const }))] } : routing.helpers;
  return Object.assign(routing.handle, helpers);
}
