import type { ClientRequest, IncomingMessage, ServerResponse } from 'node:http';
import type { BodyBudget, BodyLease } from './body-budget';
import type { RouteEndpoint } from './endpoints';
import { replaceValues, type JsonField } from './json-fields';
import type { DecisionSource, DpRankDecision, PickContext } from './types';

/** What the router keeps about one request, in one fixed-shape object. */
export class RouteState {
  /** The endpoint the request is held on (a retry moves it). */
  endpoint: RouteEndpoint | undefined = undefined;
  /** The body bytes to send upstream, when the router holds them. */
  body: Buffer | undefined = undefined;
  /** The request's share of the router's body budget, once it holds body bytes. */
  lease: BodyLease | undefined = undefined;
  /** Where `body` carries the hint field (`hints.bodyField`), rewritten to the rank it is sent to. */
  hintFields: JsonField[] | undefined = undefined;
  /** Armed while the request body is still arriving (`timeouts.bodyMs`). */
  bodyDeadline: NodeJS.Timeout | undefined = undefined;
  /** The context the policy picked with, so that a retry can pick again with it. */
  context: PickContext | undefined = undefined;
  /** When the request was dispatched, by `performance.now()`. */
  started = 0;
  /** Tries so far, the first included. */
  attempt = 1;
  /** Where the current try stands (see proxy.ts). */
  phase = 0;
  /** Endpoints tried and failed. */
  tried: RouteEndpoint[] | undefined = undefined;
  /** dpRouter's proxy: the current try's upstream request and its deadlines. */
  upstreamRequest: ClientRequest | undefined = undefined;
  connectDeadline: NodeJS.Timeout | undefined = undefined;
  firstByteDeadline: NodeJS.Timeout | undefined = undefined;

  /** Clears the current try's deadlines. */
  clearDeadlines(): void {
    clearTimeout(this.connectDeadline);
    clearTimeout(this.firstByteDeadline);
  }

  /**
   * The response closed: stop the deadlines and, when the client left before the answer was
   * complete, the upstream request (http-proxy aborts it only while the request body is still
   * arriving; a client that leaves during a long prefill would otherwise keep the engine busy).
   */
  responseClosed(res: ServerResponse): void {
    this.clearDeadlines();
    clearTimeout(this.bodyDeadline);
    if (!res.writableFinished) this.upstreamRequest?.destroy();
  }

  /**
   * The request's lease on `budget`, started on first use and released when the response
   * closes, however it ends; `undefined` when the client has already left (no close to come).
   */
  leaseFrom(budget: BodyBudget, res: ServerResponse): BodyLease | undefined {
    if (this.lease !== undefined) return this.lease;
    if (res.destroyed) return undefined;
    const lease = (this.lease = budget.lease());
    res.once('close', () => lease.release());
    return lease;
  }

  /**
   * Makes the held body's hint field carry the rank header's value for `endpoint` (`null` for
   * `rankHeader: 'none'`), so that an upstream reading the field sees the router's rank and never
   * the client's; called on dispatch and on every retry. `Content-Length` follows the new size.
   */
  carryRank(req: IncomingMessage, endpoint: RouteEndpoint): void {
    if (this.hintFields === undefined || this.body === undefined) return;
    this.body = replaceValues(this.body, this.hintFields, endpoint.headerValue ?? 'null');
    if (req.headers['transfer-encoding'] === undefined) req.headers['content-length'] = String(this.body.length);
  }
}

/**
 * `req.dpRank`: the decision as users see it, and the router's way back to the request's
 * state. One property on the request rather than two, because Express gives every `req` its
 * app's prototype (`Object.setPrototypeOf`), after which V8 builds a new hidden class for each
 * property added to that request, request after request.
 */
export class RankDecision implements DpRankDecision {
  readonly upstream: string;
  readonly url: string;
  readonly rank: number;
  readonly source: DecisionSource;
  readonly headerValue: string | undefined;
  readonly #route: RouteState;

  constructor(endpoint: RouteEndpoint, source: DecisionSource, route: RouteState) {
    this.upstream = endpoint.upstream;
    this.url = endpoint.config.url;
    this.rank = endpoint.rank;
    this.source = source;
    this.headerValue = endpoint.headerValue;
    this.#route = route;
    Object.freeze(this);
  }

  /** The state behind `req.dpRank`, when the router set it. */
  static routeOf(req: IncomingMessage): RouteState | undefined {
    const decision = req.dpRank;
    return decision !== undefined && #route in decision ? decision.#route : undefined;
  }
}

export const routeOf = RankDecision.routeOf;

export interface RoutedRequest extends IncomingMessage {
  /** Set by body parsers such as `express.json()`. */
  body?: unknown;
  originalUrl?: string;
}
