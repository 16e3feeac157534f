import type { IncomingMessage, ServerResponse } from 'node:http';
import { Registry } from 'prom-client';
import { EndpointTable } from './endpoints';
import { createMetrics, NO_METRICS, type RouterMetrics } from './metrics';
import { parseOptions, type Configuration } from './options';
import { createRankHandler, type Done, type RoutedRequest } from './rank-handler';
import type { EndpointSnapshot, Options } from './types';

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
  /** Stops every timer and socket the router owns. */
  close(): Promise<void>;
}

/** The shared state behind one router. */
export interface Routing {
  readonly config: Configuration;
  readonly table: EndpointTable;
  readonly metrics: RouterMetrics;
  readonly handle: (req: RoutedRequest, res: ServerResponse, done: Done) => void;
  readonly helpers: RoutingHelpers;
  /** Work to run on `close()`, added by the layers built on top. */
  readonly onClose: Array<() => void>;
}

/** Resolves options once and builds the endpoint table, metrics and the per-request handler. */
export function createRouting(options: Options): Routing {
  const config = parseOptions(options);
  const table = new EndpointTable(config.upstreams);
  const registry = config.metrics?.registry ?? new Registry();
  const metrics = config.metrics ? createMetrics(registry, config.metrics.prefix, table.all) : NO_METRICS;
  const onClose: Array<() => void> = [() => metrics.close()];

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
    close: () => {
      closed ??= Promise.resolve().then(() => onClose.forEach((stop) => stop()));
      return closed;
    },
  };
  return { config, table, metrics, handle: createRankHandler(config, table, metrics), helpers, onClose };
}
