import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import { withoutNomination } from '../http/hop-by-hop';
import type { Next, Terminal } from './lifecycle';
import type { RouteState, RoutedRequest } from './route-state';

/**
 * dpRank's terminal: the request goes on to the caller's own proxy with the rank header kept
 * through any `Connection` nomination, and a body the router had to read left parsed.
 */
export class HandOn implements Terminal {
  /** The caller's proxy reads the request next: a body the router reads is read to its end. */
  readonly handsOn = true;

  constructor(private readonly header: string) {}

  proceed(req: RoutedRequest & { _body?: boolean }, _res: ServerResponse, next: Next, route: RouteState): void {
    keepRankHeader(req.headers, this.header);
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

  /** Nothing to stop: the caller's proxy owns the connections. */
  close(): void {}
}

/**
 * A proxy that follows RFC 9110 removes every header the `Connection` header names: a client
 * naming the rank header there would have the router's header dropped on the way.
 */
export function keepRankHeader(headers: IncomingHttpHeaders, header: string): void {
  const connection = headers.connection;
  if (connection === undefined || connection === 'keep-alive' || connection === 'close') return;
  const left = withoutNomination(connection, header);
  if (left === connection) return;
  if (left === undefined) delete headers.connection;
  else headers.connection = left;
}
