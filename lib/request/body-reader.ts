import type { IncomingMessage, ServerResponse } from 'node:http';
import { arrivedBody, readBody, type BodyResult } from '../http/body';
import type { BodyBudget } from '../http/body-budget';
import { sendError } from '../errors';
import type { RouteState, RoutedRequest } from './route-state';

/**
 * Why a body is read: routing needs it (all of it, or the request is answered), a retry may
 * replay it, or it is buffered before the upstream connection opens (`requestBuffering`: a
 * body too large or over the budget is streamed, what was read of it first).
 */
export type BodyPurpose = 'routing' | 'replay' | 'buffer';

/** Express's `next`: called with an error for the code's own problems. */
export type Next = (error?: unknown) => void;

/**
 * What follows a body read (`bytes`: what was read, `undefined` when the body goes on unheld).
 * It gets the request's parts as arguments, so that each stage makes its own once and a read
 * allocates no closure.
 */
export type AfterBody = (req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, bytes: Buffer | undefined) => void;

/**
 * Reads request bodies into their request's state within a limit and the router's one body
 * budget, for the lifecycle (routing reads) and the forwarder (retry bodies) alike, and answers
 * what cannot be read: 413, 503 while the budget is full, 408 for a body that does not arrive.
 */
export class BodyReader {
  /** Armed per request while its body arrives: created once, so that arming it allocates nothing. */
  readonly timedOut: (req: IncomingMessage, res: ServerResponse, route: RouteState) => void;

  constructor(
    private readonly budget: BodyBudget,
    private readonly bodyTimeoutMs: number,
  ) {
    this.timedOut = (req, res, route) => this.answerTimeout(req, res, route);
  }

  /**
   * Reads the body into `route.body`, at most `limit` bytes, then calls `then`. What routing
   * cannot read is answered; a body the budget cannot hold for a retry goes on unheld
   * (`then(…, undefined)`), and is not retried. A client that left gets nothing. With
   * `takeArrived`, a body all in the stream's buffer already is taken at once (its stream ends
   * later, when the parser completes the message: only for a caller that forwards it itself).
   */
  read(req: RoutedRequest, res: ServerResponse, route: RouteState, limit: number, purpose: BodyPurpose, next: Next, then: AfterBody, takeArrived = false): void {
    const lease = route.leaseFrom(this.budget, res);
    if (lease === undefined) return;
    const arrived = takeArrived ? arrivedBody(req, limit, lease) : undefined;
    if (arrived !== undefined) {
      route.body = arrived;
      then(req, res, next, route, arrived);
      return;
    }
    readBody(req, limit, lease, purpose === 'buffer').then((result) => this.settle(req, res, route, limit, purpose, next, then, result), next);
  }

  private settle(req: RoutedRequest, res: ServerResponse, route: RouteState, limit: number, purpose: BodyPurpose, next: Next, then: AfterBody, result: BodyResult): void {
    if (!result.ok) {
      if (purpose === 'buffer' && result.failure !== 'aborted') {
        route.bodyHead = result.read;
        if (!res.destroyed) then(req, res, next, route, undefined);
      } else if (result.failure === 'over_budget' && purpose === 'replay') {
        then(req, res, next, route, undefined);
      } else if (result.failure === 'too_large') {
        res.setHeader('connection', 'close');
        sendError(res, 413, 'RequestEntityTooLargeError', `Request body exceeds ${limit} bytes.`);
      } else if (result.failure === 'over_budget') {
        this.overBudget(req, res, Number(req.headers['content-length']) || 0);
      }
      return;
    }
    route.body = result.bytes;
    // The client may have left while its body arrived.
    if (res.destroyed) return;
    then(req, res, next, route, result.bytes);
  }

  /** The router's budget cannot hold this body now: 503 to retry later, or 413 when it never could. */
  private overBudget(req: IncomingMessage, res: ServerResponse, bytes: number): void {
    // The rest of the body is discarded as it arrives (nothing is held; `timeouts.bodyMs` bounds
    // a trickle), so the connection stays usable and the client reads the answer, not a reset.
    req.resume();
    const { limit } = this.budget;
    if (bytes > limit) {
      sendError(res, 413, 'RequestEntityTooLargeError', `Request body exceeds the router's body budget of ${limit} bytes.`);
    } else {
      res.setHeader('retry-after', '1');
      sendError(res, 503, 'ServiceUnavailableError', 'The router is holding as many request bodies as it may; retry shortly.');
    }
  }

  /** The body still arriving at `timeouts.bodyMs`: answer 408, close, and stop any upstream request without blaming it. */
  private answerTimeout(req: IncomingMessage, res: ServerResponse, route: RouteState): void {
    if (req.complete || res.writableEnded || res.destroyed) return;
    route.settle();
    route.clearDeadlines();
    route.upstreamRequest?.destroy();
    if (!res.headersSent) res.setHeader('connection', 'close');
    sendError(res, 408, 'RequestTimeoutError', `The request body did not arrive within ${this.bodyTimeoutMs} ms.`);
  }
}

/** The stream was consumed before the router: forward the parser's result, re-encoded. Returns whether it did. */
export function replayParsedBody(req: RoutedRequest, route: RouteState): boolean {
  const bytes = encodeParsedBody(req.body);
  if (bytes === undefined) return false;
  req.headers['content-length'] = String(bytes.length);
  delete req.headers['transfer-encoding'];
  route.body = bytes;
  return true;
}

/** `express.raw()` leaves a Buffer, `express.text()` a string, `express.json()` a value. */
function encodeParsedBody(body: unknown): Buffer | undefined {
  if (body === undefined) return undefined;
  if (Buffer.isBuffer(body)) return body;
  if (typeof body === 'string') return Buffer.from(body);
  return Buffer.from(JSON.stringify(body));
}

/** Logged once per router when a body parser ran before it. */
export const PARSED_BODY_NOTICE =
  'express-dp-router: the request body was already parsed (e.g. by express.json()); it is re-encoded to forward it. Mount the router before body parsers to forward the original bytes.';
