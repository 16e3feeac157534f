import { ServerResponse, type ClientRequest, type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import type { BodyBudget, BodyLease } from '../http/body-budget';
import type { RouteEndpoint } from '../upstreams/endpoints';
import { insertMember, replaceValues, type JsonField } from '../http/json-fields';
import { NO_HINT, type BodyView, type HintVerdict } from './request-inputs';
import type { RouterEvents } from '../observe/events';
import type { DecisionSource, HintOutcome, PickContext } from '../types';
import type { Slot } from './route-slots';
import type { DeadlineList, Deadlined } from '../http/deadline-list';
import { carrierOf, setDpRank, type Carrier } from '../http/response-carrier';
import type { RouteSeam } from './route-hooks';

/**
 * Where a request stands: `deciding` until it has an endpoint (and while its retry body is
 * read); `waiting` once a try is sent and nothing came back (a failure may be retried);
 * `responding` once the upstream began to answer (never retried); `settled` once the try failed
 * and was counted, or the body timed out (later events of that try are echoes).
 */
export type Phase = 'deciding' | 'waiting' | 'responding' | 'settled';

/** The error codes a try's deadlines destroy its upstream request with. */
export const CONNECT_TIMEOUT = 'DP_ROUTER_CONNECT_TIMEOUT';
export const FIRST_BYTE_TIMEOUT = 'DP_ROUTER_FIRST_BYTE_TIMEOUT';

/** Whoever keeps a try's state by its response (dpRouter's proxy): told when the response closes, or when a retry moves on. */
export interface TryKeeper {
  forget(route: RouteState): void;
}

/** What every request reports to as it moves: the router's parts, resolved once. */
export interface RouteReports {
  readonly config: { readonly header: string; readonly exposeDecision: boolean };
  readonly events: RouterEvents;
  /** What the features do at each point of the way (route-hooks.ts). */
  readonly hooks: RouteSeam<RouteState>;
  /** `hints.bodyField` as a member's start, `"name":`, for a body without it. */
  readonly hintMember?: Buffer;
}

/**
 * What the router keeps about one request, in one fixed-shape object, and the steps that move
 * it: {@link assign} its first endpoint, {@link moveTo} another on a retry, {@link settle} a
 * failed try. Each step does everything holding an endpoint implies (the in-flight slot,
 * metrics, the rank header and the body's hint field, `req.dpRank`, the decision header,
 * tracing and logging) in one place.
 */
export class RouteState implements Deadlined {
  /** The endpoint the request is held on (a retry moves it). */
  endpoint: RouteEndpoint | undefined = undefined;
  /** Where the rank came from; a retry keeps it. */
  source: DecisionSource = 'assigned';
  /** The body bytes to send upstream, when the router holds them. */
  body: Buffer | undefined = undefined;
  /** The first bytes of a body streamed after buffering stopped (`requestBuffering`): sent ahead of the rest, never replayed. */
  bodyHead: Buffer | undefined = undefined;
  /** The request's share of the router's body budget, once it holds body bytes. */
  lease: BodyLease | undefined = undefined;
  /** Where `body` carries the hint field (`hints.bodyField`), rewritten to the rank it is sent to; `[]`: a JSON object the field is added to. */
  hintFields: JsonField[] | undefined = undefined;
  /** Armed while the request body is still arriving (`timeouts.bodyMs`). */
  bodyDeadline: NodeJS.Timeout | undefined = undefined;
  /** The context the policy picked with, so that a retry can pick again with it. */
  context: PickContext | undefined = undefined;
  /** The share of the prompt the pick found its endpoint holding (its result's, copied at pick time); 0 where the policy estimates none. */
  matchedShare = 0;
  /** The model the body named, where requests are routed by model: a retry stays in its pool. */
  model: string | undefined = undefined;
  /** The healthy endpoints of the request's model pool, where requests are routed by model. */
  pool: readonly RouteEndpoint[] | undefined = undefined;
  /** When the request was dispatched, by `performance.now()`. */
  started = 0;
  /** Tries so far, the first included. */
  attempt = 1;
  phase: Phase = 'deciding';
  /** Endpoints tried and failed. */
  tried: RouteEndpoint[] | undefined = undefined;
  /** dpRouter's proxy: the current try's upstream request and its deadlines. */
  upstreamRequest: ClientRequest | undefined = undefined;
  /** dpRouter's proxy the current try went through; it keeps the try until the response closes. */
  sentVia: TryKeeper | undefined = undefined;
  /** Where this request's `req.dpRank` and dpRouter's tries ride on the response (`res.locals`, or the response), found once: each read of the response misses V8's caches. */
  carrier: Carrier | undefined = undefined;
  /** Whether the response has closed (known once the close is watched: from {@link assign} on). */
  responseClosed = false;
  connectDeadline: NodeJS.Timeout | undefined = undefined;
  /** The current try's first-byte deadline, on its proxy's {@link DeadlineList}. */
  dueAt = 0;
  dueBefore: Deadlined | undefined = undefined;
  dueAfter: Deadlined | undefined = undefined;
  dueOn: DeadlineList<Deadlined> | undefined = undefined;
  /** Whether the caller may give a rank hint (`hints.trust`), judged once at the front. */
  trusted = false;
  /** The header hint's verdict, judged at the front before the client's copies are removed. */
  headerHint: HintVerdict = NO_HINT;
  /** The body's members routing reads, once read (`undefined` when routing does not need the body). */
  view: BodyView | undefined = undefined;
  /** What admission knows of the request; `undefined` without `admission`. */
  ticket: Slot<'ticket'> | undefined = undefined;
  /** Takes the request out of the admission queue while it waits there. */
  leave: (() => void) | undefined = undefined;
  /**
   * With `peers`: the prefill blocks the policy found uncached for this request, counted in its
   * endpoint's `sentBlocks` until its first token (or its end); 0 once retired.
   */
  prefillBlocks = 0;
  /**
   * A NIXL decode leg: when the prefill's KV blocks are released unless the decode engine has
   * the request (`performance.now()`, `disaggregation.kvLeaseMs` after the prefill answer); 0
   * otherwise. Its connects are cut to fit ({@link armDeadlines}) and it is not retried past it.
   */
  leaseEnds = 0;
  /** With route receipts: what the request's receipts are judged against (a retry drops it). */
  receipt: Slot<'receipt'> | undefined = undefined;
  /** With `slo`: the request's objectives and the prediction made for it. */
  slo: Slot<'slo'> | undefined = undefined;
  /** Whether the response's close is watched (one listener per request, see {@link watch}). */
  private watching = false;

  /**
   * @param headers `req.headers`, read once at the front: under Express 5 each request has a
   * hidden class of its own, so every read of `req.headers` (a getter) misses V8's caches.
   */
  constructor(
    private readonly reports: RouteReports,
    readonly headers: IncomingHttpHeaders,
  ) {}

  /**
   * The request takes its first endpoint; the slot is held until the response closes.
   * The trace context goes onto the request's headers here, before any proxy copies them.
   */
  assign(req: RoutedRequest, res: ServerResponse, endpoint: RouteEndpoint, source: DecisionSource, hintOutcome: HintOutcome | undefined, note?: string): void {
    this.source = source;
    this.hold(req, res, endpoint, note);
    this.started = performance.now();
    this.watch(res);
    this.reports.events.decided(req, endpoint, source, hintOutcome, this.headers);
  }

  /**
   * A retry: the slot, the rank header, the body's hint field and `req.dpRank` move from the
   * failed endpoint to `next`; the decision header keeps what followed the failed endpoint's
   * receipt (`; index=…`, `; waited_ms=…`, a prefill leg's `; prefill=…`).
   */
  moveTo(req: RoutedRequest, res: ServerResponse, next: RouteEndpoint): void {
    const failed = this.endpoint!;
    const { hooks } = this.reports;
    this.reports.events.retried(req, failed, next);
    failed.inflight--;
    const retrying = hooks.retrying;
    for (let i = 0; i < retrying.length; i++) retrying[i].retrying!(this, failed);
    const shown = this.reports.config.exposeDecision ? res.getHeader(DECISION_HEADER) : undefined;
    const receipt = failed.receipts[this.source];
    this.hold(req, res, next, typeof shown === 'string' && shown.startsWith(receipt) && shown.length > receipt.length ? shown.slice(receipt.length) : undefined);
    this.attempt++;
    const retried = hooks.retried;
    for (let i = 0; i < retried.length; i++) retried[i].retried!(this, failed);
  }

  /** A try is sent and waits for its answer. */
  sending(): void {
    this.phase = 'waiting';
  }

  /**
   * The upstream began to answer: no retry can replay the body or pick again from here on, so a
   * long stream does not pin what only a retry reads (the body, its members, the pick context).
   */
  responding(): void {
    this.clearDeadlines();
    this.phase = 'responding';
    this.body = undefined;
    this.view = undefined;
    this.context = undefined;
    this.hintFields = undefined;
    this.pool = undefined;
  }

  /** The try failed and is counted once: false when it was settled already. */
  settle(): boolean {
    if (this.phase === 'settled') return false;
    this.phase = 'settled';
    return true;
  }

  /**
   * Connect and first-byte deadlines for one try (the first byte's on `firstBytes`, which calls
   * {@link firstByteExpired}). The answer, a failure or the response's closing clears them; one
   * that expires destroys the upstream request with its code.
   */
  armDeadlines(proxyReq: ClientRequest, connectMs: number, firstBytes: DeadlineList<RouteState>, attempts: number): void {
    // A try moved on before its own end (a retry) must not leave its timers behind, unreachable.
    this.clearDeadlines();
    this.upstreamRequest = proxyReq;
    const socket = proxyReq.socket;
    if (socket?.connecting) {
      // Under a KV lease, each try left gets its share of the lease left: a server that does
      // not take the connection cannot hold the decode leg past it.
      const ms = this.leaseEnds === 0 ? connectMs : Math.max(1, Math.min(connectMs, (this.leaseEnds - performance.now()) / (attempts - this.attempt + 1)));
      this.connectDeadline = setTimeout(expire, ms, proxyReq, CONNECT_TIMEOUT);
      socket.once('connect', () => clearTimeout(this.connectDeadline));
    }
    firstBytes.add(this);
  }

  /** The current try's first-byte deadline passed. */
  firstByteExpired(): void {
    if (this.upstreamRequest !== undefined) expire(this.upstreamRequest, FIRST_BYTE_TIMEOUT);
  }

  /** The request waits in the admission queue: a client that leaves is taken out at once. */
  queued(res: ServerResponse, leave: () => void): void {
    this.leave = leave;
    this.watch(res);
  }

  /** Clears the current try's deadlines. */
  clearDeadlines(): void {
    clearTimeout(this.connectDeadline);
    this.dueOn?.remove(this);
  }

  /**
   * The request's lease on `budget`, started on first use and released when the response
   * closes, however it ends; `undefined` when the client has already left (no close to come).
   */
  leaseFrom(budget: BodyBudget, res: ServerResponse): BodyLease | undefined {
    if (this.lease !== undefined) return this.lease;
    if (res.destroyed) return undefined;
    const lease = (this.lease = budget.lease());
    this.watch(res);
    return lease;
  }

  /**
   * Arms the body deadline (`timeouts.bodyMs`) while the body is still arriving. The response's
   * close clears it; until then `onTimeout` finds a complete body and does nothing.
   */
  armBodyDeadline(req: IncomingMessage, res: ServerResponse, ms: number, onTimeout: (req: IncomingMessage, res: ServerResponse, route: RouteState) => void): void {
    this.bodyDeadline = setTimeout(onTimeout, ms, req, res, this);
    this.watch(res);
  }

  /**
   * One listener per request does all the work its end needs (the body deadline, the lease,
   * the slot): one closure, not one per concern. It holds the state itself: what a later
   * middleware does to `req.dpRank` cannot make a slot leak.
   */
  private watch(res: ServerResponse): void {
    if (this.watching) return;
    this.watching = true;
    listen.call(res, 'close', () => this.closed());
  }

  /**
   * Takes `endpoint`'s slot and makes everything the request carries name it. The decision
   * header is written here only, once per endpoint held, with what the decision adds (`note`,
   * e.g. `; index=exact`).
   */
  private hold(req: RoutedRequest, res: ServerResponse, endpoint: RouteEndpoint, note?: string): void {
    const { config, hooks } = this.reports;
    const source = this.source;
    endpoint.inflight++;
    const held = hooks.held;
    for (let i = 0; i < held.length; i++) held[i].held!(this, endpoint);
    const { header } = config;
    const { headers } = this;
    // A client's own hint is its claim, not the router's: receipts judge only the router's picks.
    let claimed = true;
    if (source !== 'hint') {
      const claims = hooks.claims;
      for (let i = 0; i < claims.length && claimed; i++) claimed = claims[i].claims!(this, endpoint);
    }
    if (endpoint.headerValue !== undefined && claimed) headers[header] = endpoint.headerValue;
    else if (headers[header] !== undefined) delete headers[header];
    this.endpoint = endpoint;
    this.carryRank(req, endpoint);
    setDpRank(req, res, (this.carrier ??= carrierOf(res)), endpoint.decisions[source]);
    if (config.exposeDecision) res.setHeader(DECISION_HEADER, (note === undefined ? endpoint.receipts[source] : endpoint.receipts[source] + note) + (claimed ? '' : UNCLAIMED));
  }

  /**
   * Makes the held body's hint field carry the rank header's value for `endpoint` (`null` for
   * `rankHeader: 'none'`), added first when the body has none, so that an upstream reading the
   * field sees the router's rank and never the client's. `Content-Length` follows the new size.
   */
  private carryRank(req: IncomingMessage, endpoint: RouteEndpoint): void {
    const fields = this.hintFields;
    if (fields === undefined || this.body === undefined) return;
    const value = endpoint.headerValue ?? 'null';
    this.body = fields.length === 0 ? insertMember(this.body, this.reports.hintMember!, value, fields) : replaceValues(this.body, fields, value);
    if (this.headers['transfer-encoding'] === undefined) this.headers['content-length'] = String(this.body.length);
  }

  /**
   * The response closed: stop the deadlines and, when the client left before the answer was
   * complete, the upstream request (http-proxy aborts it only while the request body is still
   * arriving; a client that leaves during a long prefill would otherwise keep the engine busy).
   * Then the slot held now (a retry may have moved it) is released. A token reservation whose
   * answer is not read is refunded.
   */
  private closed(): void {
    this.responseClosed = true;
    const { hooks } = this.reports;
    const closing = hooks.closing;
    for (let i = 0; i < closing.length; i++) closing[i].closing!(this);
    clearTimeout(this.bodyDeadline);
    this.lease?.release();
    const held = this.endpoint;
    // Answered (or left) before it had an endpoint.
    if (held === undefined) {
      this.leave?.();
      return;
    }
    this.clearDeadlines();
    this.sentVia?.forget(this);
    // Judged by the upstream's answer, not the response (`res.writableFinished`, a read V8
    // cannot cache): one that came whole has nothing left to stop.
    const upstream = this.upstreamRequest as UpstreamRequest | undefined;
    if (upstream !== undefined && upstream.res?.complete !== true) upstream.destroy();
    held.inflight--;
    const closed = hooks.closed;
    for (let i = 0; i < closed.length; i++) closed[i].closed!(this, held, upstream?.res);
  }
}

/**
 * A response's `on`, looked up once: under Express 5 every response has a hidden class of its
 * own, so `res.on` walks six prototypes on each request (about 6,000 instructions).
 */
const listen = ServerResponse.prototype.on;

function expire(proxyReq: ClientRequest, code: string): void {
  const what = code === CONNECT_TIMEOUT ? 'connect' : 'first byte';
  proxyReq.destroy(Object.assign(new Error(`upstream ${what} timeout`), { code }));
}

/** An upstream request: Node links it to its answer (`req.res`), which @types/node does not declare. */
type UpstreamRequest = ClientRequest & { res?: IncomingMessage | null };

/** The response header `exposeDecision` answers with. */
export const DECISION_HEADER = 'x-dp-router-decision';
/** What the decision header adds for a request sent without a rank header, that vLLM balances (route receipts). */
const UNCLAIMED = '; rank_claimed=false';

export interface RoutedRequest extends IncomingMessage {
  /** Set by body parsers such as `express.json()`. */
  body?: unknown;
  originalUrl?: string;
}
