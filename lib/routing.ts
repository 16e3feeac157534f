import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import type { EndpointSnapshot } from './types';
import { parseUpstreams, type UpstreamConfig, type UpstreamEntry } from './upstreams/upstream-options';

/** What a terminal with endpoints of its own (the prefill pool of disaggregation) adds to the helpers. */
export interface PoolTerminal {
  /** Its endpoints, after the services' in `endpoints()`. */
  snapshot?(): EndpointSnapshot[];
  /** Takes the upstreams it serves from a new list (checked first) and returns those for the services. */
  reconfigure?(upstreams: readonly UpstreamConfig[]): readonly UpstreamConfig[];
}

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
  setUpstreams(upstreams: readonly UpstreamEntry[]): void;
  /** Stops every timer and socket the router owns. */
  close(): Promise<void>;
}

/**
 * What the helpers work with: the router's services as far as they need them. Typed here by
 * shape, so that the public types (this module's) do not reach the services' modules, and
 * through them the optional packages' types.
 */
export interface HelperParts {
  readonly registry: Registry;
  readonly table: { snapshot(): EndpointSnapshot[] };
  /** Throws for entries the router cannot take, before anything changes. */
  checkSources(upstreams: readonly UpstreamConfig[]): void;
  /** `setUpstreams()`: the entries, validated. */
  setSources(upstreams: readonly UpstreamConfig[]): void;
  close(): Promise<void>;
}

/**
 * The middleware users mount: the lifecycle's first stage (`lifecycle.handle`), carrying the
 * router's helpers. `close()` stops the terminal (its sockets) first, then the services, last
 * started first.
 */
export function routerOf(services: HelperParts, lifecycle: { readonly handle: unknown }, terminal: { close(): void } & PoolTerminal): Middleware & RoutingHelpers {
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
    endpoints: terminal.snapshot === undefined ? () => table.snapshot() : () => [...table.snapshot(), ...terminal.snapshot!()],
    setUpstreams: (upstreams) => {
      const parsed = parseUpstreams('upstreams', upstreams);
      services.checkSources(parsed);
      services.setSources(terminal.reconfigure?.(parsed) ?? parsed);
    },
    close: () => {
      closed ??= Promise.resolve()
        .then(() => terminal.close())
        .then(() => services.close());
      return closed;
    },
  };
  return Object.assign(lifecycle.handle as Middleware, helpers);
}
