import type { ClientRequest, IncomingMessage, ServerResponse } from 'node:http';
import type { RouteEndpoint } from './endpoints';
import type { PickContext } from './types';

/**
 * What the router keeps about one request, in one object under one property: a request
 * object grows a property per write, and a fixed-shape record costs one.
 */
export class RouteState {
  /**
   * @param owner the router that keeps this state
   * @param outer the state of a router that handled the request before this one
   */
  constructor(
    readonly owner: object,
    readonly outer: RouteState | undefined,
  ) {}

  /** The endpoint the request is held on (a retry moves it). */
  endpoint: RouteEndpoint | undefined = undefined;
  /** The body bytes to send upstream, when the router holds them. */
  body: Buffer | undefined = undefined;
  /** The body as the router parsed it, when it had to read it. */
  parsedBody: unknown = undefined;
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
    if (!res.writableFinished) this.upstreamRequest?.destroy();
  }
}

export const ROUTE = Symbol('dpRouter.route');

export interface RoutedRequest extends IncomingMessage {
  [ROUTE]?: RouteState;
  /** Set by body parsers such as `express.json()`. */
  body?: unknown;
  originalUrl?: string;
}
