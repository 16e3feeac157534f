import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import type { RequestLifecycle, Terminal } from './request/lifecycle';
import type { RouterServices } from './services';
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

/**
 * The middleware users mount: the lifecycle's first stage, carrying the router's helpers.
 * `close()` stops the terminal (its sockets) first, then the services, last started first.
 */
export function routerOf(services: RouterServices, lifecycle: RequestLifecycle, terminal: Terminal): Middleware & RoutingHelpers {
  const { registry, table } = services;
  let closed: Promise<void> | undefined;
  const helpers: RoutingHelpers = {
    metrics(_req, res) {
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
    },
    registry,
    endpoints: () => table.snapshot(),
    setUpstreams: (upstreams) => services.reconfigure(parseUpstreams('upstreams', upstreams)),
    close: () => {
      closed ??= Promise.resolve()
        .then(() => terminal.close())
        .then(() => services.close());
      return closed;
    },
  };
  return Object.assign(lifecycle.handle as Middleware, helpers);
}
