import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { hasBody, isJson, readBody as readBodyBytes } from './request/body';
import type { EndpointTable, RouteEndpoint } from './upstreams/endpoints';
import { sendError } from './errors';
import { hopByHopStripper, withoutNomination } from './request/hop-by-hop';
import type { HintOutcome, RouterMetrics, UpstreamErrorKind } from './observe/metrics';
import type { ExactLookup } from './exact-prefix/index/exact-pick';
import type { Configuration } from './options';
import type { PrefixAwarePolicy, PrefixPickContext } from './policies/prefix-aware';
import type { OutlierDetector } from './upstreams/outlier-detector';
import { createRequestInputs, NO_HINT, type BodyView, type HintVerdict, type JudgedHint } from './request/request-inputs';
import { clientGone, type TryFailure, type TryOutcomes, type UpstreamProxy } from './forward/proxy';
import { RankDecision, RouteState, type RouteReports, type RoutedRequest } from './request/route-state';
import type { PickContext } from './types';
import { Admission, type AdmissionTicket } from './admission/admission';
import { createAdmissionMetrics } from './admission/metrics';

/*
 * One request's way through the router, in the order it happens:
 *
 *   handle          strip the client's rank headers, judge a header hint
 *   readBody        read the body when routing needs it (one step; `bodyLimit` says how much)
 *   decide          judge a body hint; the hinted rank, a rejection, a 503, or the policy's pick
 *   route.assign    take the endpoint's slot, count, set the rank header and `req.dpRank`, trace, log
 *   proceed         dpRank: `handOn` to the next middleware
 *                   dpRouter: `forward` → `holdForRetry` (readBody) → `send` → proxy.ts, whose
 *                   reports come back to `answered`, or `failed` → `retry` (route.moveTo → send)
 *                   or `answerFailure`, or `cutShort` / `refused`
 */

/** Express's `next`: called with an error for the code's own problems. */
export type Next = (error?: unknown) => void;
/** What follows a decision: `req.dpRank` and the rank header are set, `route` holds the endpoint. */
export type Proceed = (req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState) => void;

/** Why the body is read: routing needs it (all of it, or the request is answered), or a retry may replay it. */
type BodyPurpose = 'routing' | 'replay';

/**
 * The per-request front shared by `dpRank()` and `dpRouter()`: strips client copies of the
 * rank header, judges any hint, assigns a rank, and holds the in-flight slot until the
 * response closes; then `proceed`. Client mistakes are answered here; only the code's own
 * faults reach `next(error)`.
 */
export function createPipeline(config: Configuration, table: EndpointTable, metrics: RouterMetrics, proceed: Proceed, exact?: ExactLookup) {
  const { hintHeader, header, policy, trust, onInvalid, bodyBudget, bodyTimeoutMs } = config;
  // The decision header names the index that scored the rank (docs/exact-prefix-routing.md).
  const namesIndex = config.exposeDecision && policy.name === 'prefix-aware';
  /** Where the span gets the prefix score: a traced router with the built-in prefix-aware policy. */
  const scoredPolicy = config.tracing.enabled && 'matchedShare' in policy ? (policy as PrefixAwarePolicy) : undefined;
  // Admission control (docs/operating.md): off, and costing one check per request, unless configured.
  const admission =
    config.admission === undefined
      ? undefined
      : new Admission(config.admission, table, { metrics: createAdmissionMetrics(config.metrics, config.admission.classes), warn: (message) => config.logger.warn(message) });
  const reports: RouteReports = { config, metrics, freed: admission === undefined ? undefined : (endpoint) => admission.freed(endpoint) };
  const inputs = createRequestInputs(config, table);
  let warnedParsedBody = false;

  function handle(req: RoutedRequest, res: ServerResponse, next: Next): void {
    let trusted: boolean;
    try {
      trusted = trust === true || (trust !== false && trust(req) === true);
    } catch (error) {
      next(error);
      return;
    }
    if (admission === undefined) {
      enter(req, res, next, trusted, undefined);
      return;
    }
    try {
      admission.admit(req, res, trusted, (ticket) => enter(req, res, next, trusted, ticket));
    } catch (error) {
      // A tenant or trust function of the user's threw.
      next(error);
    }
  }

  function enter(req: RoutedRequest, res: ServerResponse, next: Next, trusted: boolean, ticket: AdmissionTicket | undefined): void {
    const route = new RouteState(reports);
    route.ticket = ticket;
    const { headers } = req;
    const headerHint = inputs.headerHint(req, trusted);
    // `delete` always takes V8's slow path, so only where there is something to remove.
    if (headers[hintHeader] !== undefined) delete headers[hintHeader];
    if (headers[header] !== undefined) delete headers[header];
    // Node answered `100 Continue` itself before this handler ran; forwarding the expectation
    // would only make http-proxy skip its `proxyReq` event, where timeouts are armed.
    if (headers.expect !== undefined) delete headers.expect;

    const wantsBody = inputs.wantsBody(req);
    const bodied = hasBody(req);
    // Each property of `req` read costs a lookup V8 cannot cache (see RankDecision): a stream
    // that has ended is complete, so `readableEnded` is read only for a complete body.
    if (bodied && !req.complete) {
      route.armBodyDeadline(req, res, bodyTimeoutMs, bodyTimedOut);
    } else if (bodied && req.readableEnded) {
      // A body parser ran first: the stream is spent, so its result is all there is to read
      // and to forward.
      if (replayParsedBody(req, route) && !warnedParsedBody) {
        warnedParsedBody = true;
        config.logger.warn(PARSED_BODY_NOTICE);
      }
      decide(req, res, next, route, trusted, headerHint, wantsBody ? inputs.parsedBodyView(req, route.body) : undefined);
      return;
    }
    if (!wantsBody || !bodied || !isJson(req)) {
      decide(req, res, next, route, trusted, headerHint, undefined);
      return;
    }
    readBody(req, res, route, 'routing', next, (bytes) => {
      if (bytes === undefined) return;
      const view = inputs.viewOf(bytes, route.lease);
      if (typeof view === 'string') {
        sendError(res, 400, 'BadRequestError', view);
        return;
      }
      decide(req, res, next, route, trusted, headerHint, view);
    });
  }

  /**
   * The one step that reads a body into `route.body`, within {@link bodyLimit} and the router's
   * body budget, then calls `then`. What routing cannot read is answered (413, or 503 while the
   * budget is full); a body the budget cannot hold for a retry goes on unheld (`then(undefined)`),
   * and is not retried. A client that left gets nothing.
   */
  function readBody(req: RoutedRequest, res: ServerResponse, route: RouteState, purpose: BodyPurpose, next: Next, then: (bytes: Buffer | undefined) => void): void {
    const lease = route.leaseFrom(bodyBudget, res);
    if (lease === undefined) return;
    const limit = bodyLimit(purpose);
    readBodyBytes(req, limit, lease).then((result) => {
      if (!result.ok) {
        if (result.failure === 'over_budget' && purpose === 'replay') {
          then(undefined);
        } else if (result.failure === 'too_large') {
          res.setHeader('connection', 'close');
          sendError(res, 413, 'RequestEntityTooLargeError', `Request body exceeds ${limit} bytes.`);
        } else if (result.failure === 'over_budget') {
          overBudget(req, res, Number(req.headers['content-length']) || 0);
        }
        return;
      }
      route.body = result.bytes;
      // The client may have left while its body arrived.
      if (res.destroyed) return;
      then(result.bytes);
    }, next);
  }

  /**
   * How much body one request may have the router hold: all routing reads it for
   * (`maxBodyBytes`), or what a retry replays (`retry.maxBodyBytes`; none with a single server,
   * where there is nowhere to retry).
   */
  function bodyLimit(purpose: BodyPurpose): number {
    return purpose === 'routing' ? config.maxBodyBytes : retryBodyLimit;
  }
  // Set by dpRouter, which knows how many servers there are to retry on.
  let retryBodyLimit = 0;

  /** The router's budget cannot hold this body now: 503 to retry later, or 413 when it never could. */
  function overBudget(req: IncomingMessage, res: ServerResponse, bytes: number): void {
    // The rest of the body is discarded as it arrives (nothing is held; `timeouts.bodyMs` bounds
    // a trickle), so the connection stays usable and the client reads the answer, not a reset.
    req.resume();
    if (bytes > bodyBudget.limit) {
      sendError(res, 413, 'RequestEntityTooLargeError', `Request body exceeds the router's body budget of ${bodyBudget.limit} bytes.`);
    } else {
      res.setHeader('retry-after', '1');
      sendError(res, 503, 'ServiceUnavailableError', 'The router is holding as many request bodies as it may; retry shortly.');
    }
  }

  /** The body still arriving at `timeouts.bodyMs`: answer 408, close, and stop any upstream request without blaming it. */
  function bodyTimedOut(req: IncomingMessage, res: ServerResponse, route: RouteState): void {
    if (req.complete || res.writableEnded || res.destroyed) return;
    route.settle();
    route.clearDeadlines();
    route.upstreamRequest?.destroy();
    if (!res.headersSent) res.setHeader('connection', 'close');
    sendError(res, 408, 'RequestTimeoutError', `The request body did not arrive within ${bodyTimeoutMs} ms.`);
  }

  function decide(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, trusted: boolean, headerHint: HintVerdict, body: BodyView | undefined): void {
    if (res.destroyed) return;
    route.hintFields = inputs.hintFields(body);
    const verdict = headerHint === NO_HINT ? inputs.bodyHint(body, trusted) : headerHint;
    if (verdict.outcome !== 'none') metrics.hint(verdict.outcome);
    if (verdict.outcome === 'accepted') {
      if (admission !== undefined) {
        admitHinted(req, res, next, route, verdict.rank!);
        return;
      }
      // Judged available: the rank has a healthy replica.
      route.assign(req, res, table.leastLoadedOfRank(verdict.rank!)!, 'hint', 'accepted');
      proceed(req, res, next, route);
      return;
    }
    if (onInvalid === 'reject' && verdict.outcome !== 'none' && verdict.outcome !== 'untrusted') {
      reject(res, verdict);
      return;
    }
    const candidates = table.healthy();
    if (candidates.length === 0) {
      sendError(res, 503, 'ServiceUnavailableError', 'No healthy data-parallel endpoint is available.');
      return;
    }
    const affinityKey = policy.usesAffinityKey ? inputs.affinityKey(req, body, route.lease) : undefined;
    const prompt = policy.usesPrompt && body !== undefined ? inputs.prompt(body, route.lease) : undefined;
    const context: PickContext = { path: req.originalUrl ?? req.url ?? '/', affinityKey, prompt };
    // A retry picks again among other candidates: without this pick's exact view of these.
    route.context = context;
    const picking: PrefixPickContext = exact !== undefined && prompt !== undefined ? withExact(context, body!, route, candidates) : context;
    let chosen: RouteEndpoint;
    try {
      chosen = policy.pick(candidates, picking) as RouteEndpoint;
    } catch (error) {
      next(error);
      return;
    }
    if (!candidates.includes(chosen)) {
      next(new TypeError(`express-dp-router: policy '${policy.name}' returned an endpoint that was not among the candidates.`));
      return;
    }
    if (admission !== undefined) {
      admitAssigned(req, res, next, route, chosen, verdict.outcome === 'none' ? undefined : verdict.outcome, picking, prompt);
      return;
    }
    route.assign(req, res, chosen, 'assigned', verdict.outcome === 'none' ? undefined : verdict.outcome);
    if (namesIndex) res.setHeader(DECISION_HEADER, `${chosen.receipts.assigned}; index=${picking.exact?.source ?? 'approximate'}`);
    if (scoredPolicy !== undefined && prompt !== undefined) config.tracing.prefixScored(req, picking.exact?.source ?? 'approximate', scoredPolicy.matchedShare);
    proceed(req, res, next, route);
  }

  /** A trusted hint under admission: its rank's least loaded replica with room, or a wait for that rank (it is never moved). */
  function admitHinted(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, rank: number): void {
    const free = admission!.freeOfRank(rank);
    if (free !== undefined) {
      admission!.admitted();
      seat(req, res, next, route, free, 'hint', 'accepted', undefined, undefined);
      return;
    }
    queue(req, res, next, route, rank, undefined, (endpoint) => seat(req, res, next, route, endpoint, 'hint', 'accepted', undefined, undefined));
  }

  /**
   * The policy's pick under admission: taken when it has room; else the policy's pick among the
   * endpoints with room; else a wait in the fair queue, for the policy's pick among those free
   * when a slot frees.
   */
  function admitAssigned(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, chosen: RouteEndpoint, outcome: HintOutcome | undefined, picking: PrefixPickContext, prompt: string | undefined): void {
    const gate = admission!;
    if (!gate.full(chosen)) {
      gate.admitted();
      seat(req, res, next, route, chosen, 'assigned', outcome, picking, prompt);
      return;
    }
    const context = route.context!;
    const choose = (free: readonly RouteEndpoint[]): RouteEndpoint | undefined => {
      if (free.length === 0) return undefined;
      try {
        const picked = policy.pick(free, context) as RouteEndpoint;
        return free.includes(picked) ? picked : free[0];
      } catch {
        return free[0];
      }
    };
    const other = choose(gate.free());
    if (other !== undefined) {
      gate.admitted();
      seat(req, res, next, route, other, 'assigned', outcome, context, prompt);
      return;
    }
    queue(req, res, next, route, undefined, choose, (endpoint) => seat(req, res, next, route, endpoint, 'assigned', outcome, context, prompt));
  }

  /** Waits in the admission queue (or is answered 429 when it is full); a released request goes on at `go`. */
  function queue(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, rank: number | undefined, choose: Parameters<Admission['wait']>[3], go: (endpoint: RouteEndpoint) => void): void {
    const leave = admission!.wait(res, route.ticket!, rank, choose, (endpoint) => {
      route.leave = undefined;
      try {
        go(endpoint);
      } catch (error) {
        next(error);
      }
    });
    if (leave !== undefined) route.queued(res, leave);
  }

  /** The endpoint is the request's: assign, name it (and the wait) in the decision header and the span, go on. */
  function seat(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, endpoint: RouteEndpoint, source: 'hint' | 'assigned', outcome: HintOutcome | undefined, picking: PrefixPickContext | undefined, prompt: string | undefined): void {
    route.assign(req, res, endpoint, source, outcome);
    const waitedMs = Math.round(route.ticket!.waitedMs);
    if (config.exposeDecision) {
      const index = namesIndex && picking !== undefined ? `; index=${picking.exact?.source ?? 'approximate'}` : '';
      res.setHeader(DECISION_HEADER, `${endpoint.receipts[source]}${index}; waited_ms=${waitedMs}`);
    }
    if (scoredPolicy !== undefined && prompt !== undefined && picking !== undefined) config.tracing.prefixScored(req, picking.exact?.source ?? 'approximate', scoredPolicy.matchedShare);
    config.tracing.admitted(req, config.admission!.classes[route.ticket!.priority], waitedMs);
    proceed(req, res, next, route);
  }

  /**
   * The pick context with the exact index's view of the candidates, from the whole body (a
   * chat's template fields count), decoded within the body budget and dropped after.
   */
  function withExact(context: PickContext, body: BodyView, route: RouteState, candidates: readonly RouteEndpoint[]): PrefixPickContext {
    if (body.members !== undefined) {
      const found = exact!.lookupRequest(context.path, body.bytes, candidates, body.members);
      return found === undefined ? context : { ...context, exact: found };
    }
    const cost = BODY_DECODE_FACTOR * body.bytes.length;
    const lease = route.lease;
    if (lease !== undefined && !lease.grow(cost)) return context;
    try {
      const found = exact!.lookupRequest(context.path, body.bytes, candidates);
      return found === undefined ? context : { ...context, exact: found };
    } finally {
      lease?.shrink(cost);
    }
  }

  function reject(res: ServerResponse, verdict: JudgedHint): void {
    const name = verdict.param;
    if (verdict.outcome === 'malformed') {
      sendError(res, 400, 'BadRequestError', `${name} must be a single non-negative decimal rank without sign, spaces or leading zeros.`, name);
    } else if (verdict.outcome === 'out_of_range') {
      sendError(res, 400, 'BadRequestError', `${name} ${verdict.rank} is not a routable data-parallel rank (routable: ${table.routableRanks}).`, name);
    } else {
      sendError(res, 503, 'ServiceUnavailableError', `Data-parallel rank ${verdict.rank} has no healthy endpoint.`, name);
    }
  }

  return {
    handle,
    readBody,
    admission,
    bodyLimit,
    /** Sets what a retry may hold (`retry.maxBodyBytes`, or 0 where there is nowhere to retry). */
    setRetryBodyLimit(limit: number): void {
      retryBodyLimit = limit;
    },
  };
}

/** The front of the request path, as `createPipeline` builds it. */
export type Pipeline = ReturnType<typeof createPipeline>;

/**
 * dpRank's end: the request goes on to the caller's own proxy with the rank header kept through
 * any `Connection` nomination, and a body the router had to read left parsed.
 */
export function handOn(header: string): Proceed {
  return function handOn(req: RoutedRequest & { _body?: boolean }, _res, next, route) {
    keepRankHeader(req.headers, header);
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
  };
}

/** What dpRouter's end works with: the proxies and the outlier detector it owns. */
export interface ForwardingParts {
  readonly config: Configuration;
  readonly table: EndpointTable;
  readonly metrics: RouterMetrics;
  readonly pipeline: Pipeline;
  readonly detector: OutlierDetector | undefined;
  /** The proxy of the upstream `endpoint` is reached through. */
  proxyOf(endpoint: RouteEndpoint): UpstreamProxy;
}

/**
 * dpRouter's end: prepares the request for its upstream, holds its body for a retry, sends it,
 * and takes the proxy's reports of each try (`outcomes`): an answer, or a failure that is
 * retried on another server or answered.
 */
export function createForwarding(parts: ForwardingParts): { forward: Proceed; outcomes: TryOutcomes } {
  const { config, table, metrics, pipeline, detector } = parts;
  const { policy, retryAttempts } = config;
  const { admission } = pipeline;
  // The router's own rank header, set already, survives a client's `Connection` nomination.
  // The upstream agent keeps connections alive: a client's `keep-alive` is what it would send.
  const stripHopByHop = hopByHopStripper([config.header], 'keep-alive');
  const replaceForwarded = config.xfwd === 'replace';

  function forward(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    // Express strips the mount path from req.url; upstream must see the path the client sent.
    // Stored only when it differs: a store to `req` costs far more than a read.
    const originalUrl = req.originalUrl;
    if (originalUrl !== undefined && req.url !== originalUrl) req.url = originalUrl;
    const { headers } = req;
    if (headers.upgrade !== undefined && WEBSOCKET.test(headers.upgrade)) {
      // Stripped like any hop-by-hop header, the upgrade would reach the engine as a plain
      // request to a WebSocket-only route and come back as a puzzling 404 or 403.
      sendError(res, 501, 'NotImplementedError', 'The gateway does not proxy WebSocket upgrades; connect to the vLLM server directly for WebSocket endpoints.', 'upgrade');
      return;
    }
    stripHopByHop(headers);
    if (replaceForwarded) dropForwarded(headers);
    holdForRetry(req, res, next, route);
  }

  /**
   * Holds the body so that a retry can replay it; the limit bounds what one request holds, the
   * body budget what all do. Past the budget the body is streamed and the request not retried.
   */
  function holdForRetry(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    if (route.body === undefined && replayableSize(req, pipeline.bodyLimit('replay'))) {
      pipeline.readBody(req, res, route, 'replay', next, () => send(req, res, next, route));
      return;
    }
    send(req, res, next, route);
  }

  /** Starts one try at the endpoint the request holds. */
  function send(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    const endpoint = route.endpoint!;
    route.sending();
    if (detector?.dispatched(endpoint, res)) {
      // This request is the half-open endpoint's one trial; if the client leaves before it
      // decides, the endpoint must be free for another trial.
      res.once('close', () => detector.abandoned(endpoint, res));
    }
    parts.proxyOf(endpoint).handle(req, res, next);
  }

  /** The upstream began to answer. */
  function answered(req: RoutedRequest, _res: ServerResponse, answer: IncomingMessage): void {
    const route = RankDecision.routeOf(req)!;
    route.responding();
    const endpoint = route.endpoint!;
    metrics.responded(endpoint, answer, route.started);
    if (route.ticket !== undefined && admission!.counts) admission!.count(route.ticket, req, answer);
    if (answer.statusCode !== undefined && answer.statusCode >= 500) {
      metrics.upstreamError(endpoint, 'status_5xx');
      detector?.failed(endpoint, 'request', req);
    } else {
      // Any answer below 500, a 4xx included, shows the endpoint alive: a client's bad
      // request is never the endpoint's fault.
      detector?.succeeded(endpoint);
    }
  }

  /** The try failed: counted once against its endpoint, then retried elsewhere or answered. */
  function failed(req: RoutedRequest, res: ServerResponse, failure: TryFailure): void {
    const route = RankDecision.routeOf(req)!;
    route.clearDeadlines();
    if (route.phase === 'responding') {
      cutShort(req, res);
      return;
    }
    // A client that left is not the upstream's fault, and there is no one to answer.
    if (!route.settle() || clientGone(res)) return;
    const endpoint = route.endpoint!;
    metrics.upstreamError(endpoint, ERROR_KIND[failure]);
    // A first-byte timeout may be the request's own doing (a long generation); the rest never reached an answer.
    detector?.failed(endpoint, failure === 'first_byte_timeout' ? 'request' : 'connection', req);
    // Not after a first-byte timeout: the engine may still be working on it, and the client
    // has already waited the whole deadline.
    if (failure !== 'first_byte_timeout' && retry(req, res, route, endpoint)) return;
    answerFailure(req, res, failure);
  }

  /**
   * Sends the request again to another server: a refused or reset connection belongs to the API
   * server, which all the ranks it serves share, so the endpoints of an upstream URL that failed
   * are not tried again for this request. The policy picks among the healthy endpoints left; a
   * hint goes to the least loaded replica of the same rank elsewhere. Returns false when the
   * request must not or cannot be retried, and the caller answers the error.
   */
  function retry(req: RoutedRequest, res: ServerResponse, route: RouteState, failed: RouteEndpoint): boolean {
    if (route.attempt >= retryAttempts || res.headersSent) return false;
    // Only what can be replayed byte for byte: a buffered body, or none at all.
    if (route.body === undefined && hasBody(req)) return false;
    const tried = (route.tried ??= []);
    tried.push(failed);
    // Under admission a retry goes only where there is room: capacity holds for retries too.
    const skip = admission === undefined ? (endpoint: RouteEndpoint) => failedBefore(endpoint, tried) : (endpoint: RouteEndpoint) => failedBefore(endpoint, tried) || admission.full(endpoint);
    const next = route.source === 'hint' ? table.leastLoadedOfRank(failed.rank, skip) : pickAgain(req, route.context, skip);
    if (next === undefined) return false;
    route.moveTo(req, res, next);
    undoForwardedHeaders(req);
    // http-proxy-middleware calls `next` only on its own errors; the first try's `next` belongs
    // to Express and has been handed on, so a retry answers them itself.
    send(req, res, (error) => answerProxyFailure(res, error), route);
    return true;
  }

  function pickAgain(req: RoutedRequest, picked: PickContext | undefined, skip: (endpoint: RouteEndpoint) => boolean): RouteEndpoint | undefined {
    const candidates = table.healthy().filter((endpoint) => !skip(endpoint));
    if (candidates.length === 0) return undefined;
    const context: PickContext = picked ?? { path: req.url ?? '/', affinityKey: undefined, prompt: undefined };
    try {
      const chosen = policy.pick(candidates, context) as RouteEndpoint;
      return candidates.includes(chosen) ? chosen : undefined;
    } catch {
      // The policy's fault surfaces on first picks; a retry answers the upstream's error instead.
      return undefined;
    }
  }

  /**
   * The upstream failed after it began to answer (or the first of the two events that report
   * it, for the request and the response, arrived): counted once as a reset. With nothing
   * sent to the client yet it still gets a proper 502; mid-body only cutting the connection
   * tells it the answer is incomplete.
   */
  function cutShort(req: RoutedRequest, res: ServerResponse): void {
    if (!settleAsReset(req, res)) return;
    if (res.headersSent) {
      res.destroy();
      return;
    }
    for (const name of res.getHeaderNames()) if (name !== DECISION_HEADER) res.removeHeader(name);
    res.statusMessage = '';
    sendError(res, 502, 'BadGatewayError', `The upstream${rankOf(req)} closed the connection before finishing its answer.`);
  }

  /**
   * The upstream answered with something the gateway cannot relay as HTTP (the proxy dropped
   * that connection): the client gets a 502, and the endpoint is counted `reset`, as for an
   * answer cut short: the upstream broke HTTP, it did not report a failure of its own.
   */
  function refused(req: RoutedRequest, res: ServerResponse, why: string): void {
    const route = RankDecision.routeOf(req)!;
    route.clearDeadlines();
    route.body = undefined;
    if (settleAsReset(req, res)) sendError(res, 502, 'BadGatewayError', `The upstream${rankOf(req)} ${why}, which the gateway cannot relay.`);
  }

  /**
   * Settles the try as a reset, counted against its endpoint; false when it was settled
   * already or the client left (a client that left is not the upstream's fault).
   */
  function settleAsReset(req: RoutedRequest, res: ServerResponse): boolean {
    const route = RankDecision.routeOf(req)!;
    if (!route.settle() || clientGone(res)) return false;
    const endpoint = route.endpoint!;
    metrics.upstreamError(endpoint, 'reset');
    detector?.failed(endpoint, 'request', req);
    return true;
  }

  return { forward, outcomes: { answered, failed, cutShort, refused } };
}

const PARSED_BODY_NOTICE =
  'express-dp-router: the request body was already parsed (e.g. by express.json()); it is re-encoded to forward it. Mount the router before body parsers to forward the original bytes.';

/** The stream was consumed before us: forward the parser's result, re-encoded. Returns whether it did. */
function replayParsedBody(req: RoutedRequest, route: RouteState): boolean {
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

/**
 * A proxy that follows RFC 9110 removes every header the `Connection` header names: a client
 * naming the rank header there would have the router's header dropped on the way.
 */
function keepRankHeader(headers: IncomingHttpHeaders, header: string): void {
  const connection = headers.connection;
  if (connection === undefined || connection === 'keep-alive' || connection === 'close') return;
  const left = withoutNomination(connection, header);
  if (left === connection) return;
  if (left === undefined) delete headers.connection;
  else headers.connection = left;
}

/**
 * Whether the body is worth holding for retries: declared by `Content-Length` (so its size is
 * known, and taken from the budget, before a byte is read), not empty, within the limit, and
 * still unread.
 */
function replayableSize(req: IncomingMessage, limit: number): boolean {
  if (limit === 0 || req.readableEnded || req.headers['transfer-encoding'] !== undefined) return false;
  const declared = req.headers['content-length'];
  if (declared === undefined || declared === '0') return false;
  const size = Number(declared);
  return size > 0 && size <= limit;
}

const WEBSOCKET = /(?:^|[\s,])websocket(?:$|[\s,/])/i;

/** What a client claims about earlier hops; http-proxy then sets the gateway's own view. */
const FORWARDED = ['forwarded', 'x-forwarded-for', 'x-forwarded-host', 'x-forwarded-port', 'x-forwarded-proto'] as const;

function dropForwarded(headers: IncomingHttpHeaders): void {
  for (const name of FORWARDED) if (headers[name] !== undefined) delete headers[name];
}

/** The headers http-proxy's `xfwd` appends to on every try. */
const FORWARDED_APPENDED = ['x-forwarded-for', 'x-forwarded-port', 'x-forwarded-proto'] as const;

/** Removes the values http-proxy appended on the failed try, so the next one appends once. */
function undoForwardedHeaders(req: IncomingMessage): void {
  for (const name of FORWARDED_APPENDED) {
    const value = req.headers[name];
    if (typeof value !== 'string') continue;
    const comma = value.lastIndexOf(',');
    if (comma === -1) delete req.headers[name];
    else req.headers[name] = value.slice(0, comma);
  }
}

/** Whether the endpoint's upstream server already failed this request. */
function failedBefore(endpoint: RouteEndpoint, tried: readonly RouteEndpoint[]): boolean {
  for (const failed of tried) if (failed.config.url === endpoint.config.url) return true;
  return false;
}

/** A try's failure as the metrics count it. */
const ERROR_KIND: Readonly<Record<TryFailure, Exclude<UpstreamErrorKind, 'status_5xx'>>> = {
  refused: 'connect',
  connect_timeout: 'timeout',
  timeout: 'timeout',
  first_byte_timeout: 'timeout',
  reset: 'reset',
};

/** The gateway's own answer to a try that failed and was not retried: 504 for a timeout, 502 otherwise. */
function answerFailure(req: IncomingMessage, res: ServerResponse, failure: TryFailure): void {
  const rank = rankOf(req);
  if (failure === 'connect_timeout') sendError(res, 504, 'GatewayTimeoutError', `The upstream${rank} did not accept the connection in time.`);
  else if (failure === 'timeout' || failure === 'first_byte_timeout') sendError(res, 504, 'GatewayTimeoutError', `The upstream${rank} did not answer in time.`);
  else if (failure === 'refused') sendError(res, 502, 'BadGatewayError', `The upstream${rank} refused the connection.`);
  else sendError(res, 502, 'BadGatewayError', `The upstream${rank} closed the connection.`);
}

/** Kept on a replaced error answer: it says where the request went. */
const DECISION_HEADER = 'x-dp-router-decision';

/** What decoding a whole body for the tokenizer may cost, per body byte: its text twice (UTF-16) and the values, with margin. */
const BODY_DECODE_FACTOR = 4;

function rankOf(req: IncomingMessage): string {
  return req.dpRank ? ` for data-parallel rank ${req.dpRank.rank}` : '';
}

/** http-proxy-middleware failed before proxying a retry: answer here. */
function answerProxyFailure(res: ServerResponse, error?: unknown): void {
  if (error === undefined) return;
  sendError(res, 502, 'BadGatewayError', 'The request could not be proxied to another upstream.');
}
