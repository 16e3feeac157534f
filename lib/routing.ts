import type { IncomingMessage, ServerResponse } from 'node:http';
import { Registry } from 'prom-client';
import { watchEngines, watchedUpstreams } from './upstreams/engine-watch';
import { EndpointTable, type RouteEndpoint } from './upstreams/endpoints';
import { createExactRouting } from './exact-prefix/exact-routing';
import { loadTokenizer } from './exact-prefix/options';
import { createMetrics, NO_METRICS, type RouterMetrics } from './observe/metrics';
import { parseOptions, type Configuration, type DpRankOptions, type DpRouterOptions, type Mode, type UpstreamConfig } from './options';
import { createPipeline, type Pipeline, type Proceed } from './pipeline';
import type { EndpointSnapshot } from './types';
import { parseUpstreams, type UpstreamOptions } from './upstreams/upstream-options';

/** A Connect/Express-style handler, typed on `node:http` so it fits Express 4 and 5 alike. */
export type Middleware = (req: IncomingMessage, res: ServerResponse, next: (error?: unknown) => void) => void;

/** What `dpRank()` and `dpRouter()` carry besides being middleware. */
export interface RoutingHelpers {
  /** Serves the registry in Prometheus text format with its content type. */
  readonly metrics: (req: IncomingMessage, res: ServerResponse) => void;
  /** The prom-client registry in use (an empty private one with `metrics: false`). */
  readonly registry: Registry;
  /** A snapshot of every endpoint. */
  endpoints(): EndpointSnapshot[];
  /**
   * Replaces the upstreams at run time, validated as at creation (a wrong one throws
   * `TypeError` and changes nothing). Requests in flight finish where they are; endpoints
   * that stay keep their counts and health; removed endpoints' metric series are removed.
   */
  setUpstreams(upstreams: readonly UpstreamOptions[]): void;
  /** Stops every timer and socket the router owns. */
  close(): Promise<void>;
}

/** The shared state behind one router. */
export interface Routing {
  readonly config: Configuration;
  readonly table: EndpointTable;
  readonly metrics: RouterMetrics;
  /** The middleware: decides, then hands the request to the layer's `proceed`. */
  readonly handle: Middleware;
  /** The request path's front, for the layer built on top (dpRouter reads retry bodies with it). */
  readonly pipeline: Pipeline;
  readonly helpers: RoutingHelpers;
  /** Work to run on `close()`, added by the layers built on top. */
  readonly onClose: Array<() => void | Promise<void>>;
  /** Work to run after the upstreams changed, added by the layers built on top. */
  readonly onReconfigure: Array<(change: EndpointChange) => void>;
}

/** What a reconfiguration changed. */
export interface EndpointChange {
  readonly added: readonly RouteEndpoint[];
  readonly removed: readonly RouteEndpoint[];
}

/**
 * Resolves options once and builds the endpoint table, metrics and the per-request handler,
 * which calls `proceed` once a request has its endpoint.
 */
export function createRouting(options: DpRankOptions | DpRouterOptions, proceed: Proceed, mode: Mode = 'dpRouter'): Routing {
  const config = parseOptions(options, mode);
  const table = new EndpointTable(config.upstreams);
  const registry = config.metrics?.registry ?? new Registry();
  const scraped = () => watchedUpstreams(table.upstreams, config.loadFeedback);
  const metrics = config.metrics ? createMetrics(registry, config.metrics.prefix, table, scraped()) : NO_METRICS;
  const onReconfigure: Array<(change: EndpointChange) => void> = [];

  const reconfigure = (upstreams: readonly UpstreamConfig[]) => {
    const change = table.reconfigure(upstreams);
    metrics.track(change, scraped());
    watch.sync();
    for (const follow of onReconfigure) follow(change);
  };
  // Discovery replaces one upstream's ranks and keeps everything else as it is.
  const watch = watchEngines(table, config.loadFeedback, metrics, (upstream, ranks) => {
    const startRank = ranks[0];
    const discovered: UpstreamConfig = { ...upstream, startRank, dataParallelSize: ranks[ranks.length - 1] - startRank + 1, ranks };
    config.logger.warn(
      `express-dp-router: upstream '${upstream.name}' serves ranks ${ranks.join(', ')} by its /metrics (was: ${upstream.ranks.join(', ')}); routing to those now.`,
    );
    reconfigure(table.upstreams.map((current) => (current.name === upstream.name ? discovered : current)));
  });
  const onClose: Array<() => void | Promise<void>> = [() => watch.stop(), () => metrics.close()];
  // Exact prefix routing: with a tokenizer, every upstream with `kvEvents` is subscribed to.
  const exact =
    config.tokenizer === undefined
      ? undefined
      : createExactRouting({
          upstreams: config.upstreams,
          tokenizer: loadTokenizer('prefixAware.tokenizer', config.tokenizer),
          metrics: config.metrics,
          warn: (message) => config.logger.warn(message),
        });
  if (exact !== undefined) {
    onReconfigure.push(() => exact.reconfigure(table.upstreams));
    onClose.push(() => exact.close());
  }

  const serveMetrics = (_req: IncomingMessage, res: ServerResponse): void => {
    registry.metrics().then(
      (text) => {
        res.writeHead(200, { 'content-type': registry.contentType });
        res.end(text);
      },
      () => {
        res.writeHead(500, { 'content-type': 'text/plain' });
        res.end('metrics collection failed\n');
      },
    );
  };

  let closed: Promise<void> | undefined;
  const helpers: RoutingHelpers = {
    metrics: serveMetrics,
    registry,
    endpoints: () => table.snapshot(),
    setUpstreams: (upstreams) => reconfigure(parseUpstreams('upstreams', upstreams)),
    close: () => {
      closed ??= Promise.resolve()
        .then(() => Promise.all(onClose.map((stop) => stop())))
        .then(() => undefined);
      return closed;
    },
  };
  const pipeline = createPipeline(config, table, metrics, proceed, exact);
  const { admission } = pipeline;
  // New endpoints have room for requests waiting already.
  if (admission !== undefined) onReconfigure.push((change) => change.added.forEach((endpoint) => admission.freed(endpoint)));
  return { config, table, metrics, handle: pipeline.handle as Middleware, pipeline, helpers, onClose, onReconfigure };
}
