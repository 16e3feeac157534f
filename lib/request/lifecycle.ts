import type { ServerResponse } from 'node:http';
import { hasBody, isJson, wholeInBuffer } from '../http/body';
import { PARSED_BODY_NOTICE, replayParsedBody, type AfterBody, type BodyReader, type Next } from './body-reader';
import { PolicyError, sendError } from '../errors';
import { bareContext, safePick, UNREAD_CONTEXT } from '../policies/safe-pick';
import type { PickResult, RoutePolicy } from '../policies/route-policy';
import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import type { ExactLookup } from '../policies/exact-pick';
import type { RouterEvents } from '../observe/events';
import type { Tracing } from '../observe/tracing';
import type { RouterMetrics } from '../observe/metrics';
import type { HintConfig } from './hint-options';
import type { PrefixPickContext } from '../policies/prefix-aware';
import { NO_HINT, type BodyView, type JudgedHint, type RequestInputs } from './request-inputs';
import { RouteState, type RouteReports, type RoutedRequest } from './route-state';
import type { DecisionSource, HintOutcome, IndexSource, PickContext } from '../types';
import { leastLoadedOfRank, type ModelStage, type ServedModels } from './model-stage';
import type { Gate } from './gate';
import { exactContext } from './exact-context';
import { hintRejection } from './hint-rejection';
import { balancedByVllm } from './vllm-paths';
import type { VllmBalancing } from './vllm-balancing';
import type { LifecycleConfig, LifecycleParts, Terminal } from './lifecycle-parts';
import type { RouteSeam } from './route-hooks';

export type { Next } from './body-reader';
export type { LifecycleParts, Terminal } from './lifecycle-parts';

/**
 * One request's way through the router. The methods are the stages in the order a request meets
 * them, each calling the next:
 *
 *   handle    strip the client's rank headers, judge trust and a header hint
 *   admit     admission: the tenant and class (nothing waits yet)
 *   readBody  read the body when routing needs it, within `maxBodyBytes` and the body budget;
 *             otherwise buffer it (`requestBuffering`) so that no upstream connection waits on a slow client
 *   decide    judge a body hint; the hinted rank, a rejection, a 503, or the policy's pick
 *             among {@link candidates}
 *   assign    take the endpoint's slot, count, set the rank header, `req.dpRank` and the
 *             decision header, trace, log; then the terminal
 *
 * Client mistakes are answered where they are found; only the code's own faults reach `next(error)`.
 */
export class RequestLifecycle {
  /** The middleware: the first stage, bound. */
  readonly handle: (req: RoutedRequest, res: ServerResponse, next: Next) => void;
  private readonly reports: RouteReports;
  private readonly config: LifecycleConfig;
  private readonly hints: HintConfig;
  private readonly bodyTimeoutMs: number;
  /** `requestBuffering.maxBytes`: 0 when off. */
  private readonly bufferMaxBytes: number;
  private readonly table: EndpointTable;
  private readonly metrics: RouterMetrics;
  private readonly events: RouterEvents;
  private readonly tracing: Tracing;
  private readonly policy: RoutePolicy;
  private readonly inputs: RequestInputs;
  private readonly bodies: BodyReader;
  private readonly models: ModelStage;
  /** `models.pools`, whose `active` and `listed` every request reads. */
  private readonly pools: ServedModels;
  private readonly admission: Gate | undefined;
  /** Where requests go that vLLM balances itself. */
  private readonly balancing: VllmBalancing;
  /** Exact prefix routing, when the policy scores on a prefix index (`namesIndex`). */
  private readonly exact: ExactLookup | undefined;
  /** The decision header names the index that scored the rank (docs/exact-prefix-routing.md). */
  private readonly namesIndex: boolean;
  /** The span gets the pick's matched share: a traced router with a policy that reports it. */
  private readonly reportsShare: boolean;
  private warnedParsedBody = false;
  /** After a buffered body: decide. Made once, so that a read allocates no closure. */
  private readonly buffered: AfterBody;
  /** After a body routing reads: its members into `route.view` (400 for one that is not JSON), then decide. */
  private readonly routed: AfterBody;
  /** What the features do at each point of the way (route-hooks.ts). */
  private readonly hooks: RouteSeam<RouteState>;
  /** Whether a body all in the stream's buffer is taken at once, without waiting for its end (not for a terminal that {@link Terminal.handsOn}). */
  private readonly takesArrived: boolean;
  /** Whether request buffering lets a body that arrived whole with its headers go on unread (dpRouter with `requestBuffering`). */
  private readonly passesArrived: boolean;

  constructor(
    parts: LifecycleParts,
    private readonly terminal: Terminal,
  ) {
    const { config } = parts;
    this.config = config;
    this.hints = config.hints;
    this.bodyTimeoutMs = config.timeouts.bodyMs;
    this.bufferMaxBytes = config.requestBuffering.maxBytes;
    this.table = parts.table;
    this.metrics = parts.metrics;
    this.inputs = parts.inputs;
    this.bodies = parts.bodies;
    this.events = parts.events;
    this.tracing = parts.tracing;
    const policy = (this.policy = parts.policy);
    this.models = parts.models;
    this.pools = parts.models.pools;
    this.balancing = parts.balancing;
    this.exact = policy.namesIndex ? parts.exact : undefined;
    this.namesIndex = config.exposeDecision && policy.namesIndex;
    this.reportsShare = parts.tracing.enabled && policy.reportsMatchedShare;
    this.admission = parts.admission;
    this.hooks = parts.hooks;
    this.reports = { config, events: parts.events, hooks: parts.hooks, hintMember: parts.inputs.hintMember };
    this.takesArrived = terminal.handsOn !== true;
    this.passesArrived = this.takesArrived && this.bufferMaxBytes > 0;
    const lifecycle = this;
    // Named, for stack traces and Express's OpenTelemetry spans (`middleware - expressDpRouter`).
    this.handle = function expressDpRouter(req, res, next) {
      lifecycle.front(req, res, next);
    };
    this.buffered = (req, res, next, route) => this.decide(req, res, next, route);
    this.routed = (req, res, next, route, bytes) => {
      if (bytes === undefined) return;
      const view = this.inputs.viewOf(bytes, route.lease);
      if (typeof view === 'string') {
        sendError(res, 400, 'BadRequestError', view);
        return;
      }
      route.view = view;
      this.decide(req, res, next, route);
    };
  }

  /** The front: the client's rank headers are judged, then removed, before anything else reads them. */
  front(req: RoutedRequest, res: ServerResponse, next: Next): void {
    if (this.pools.listed && this.models.answersModelList(req)) {
      this.models.sendModelList(res);
      return;
    }
    const { headers } = req;
    const route = new RouteState(this.reports, headers);
    const { trust, header: hintHeader } = this.hints;
    const { header } = this.config;
    try {
      route.trusted = trust === true || (trust !== false && trust(req) === true);
      const front = this.hooks.front;
      for (let i = 0; i < front.length; i++) front[i].front!(route, req, headers);
    } catch (error) {
      next(error);
      return;
    }
    route.headerHint = this.inputs.headerHint(req, route.trusted, headers);
    // `delete` always takes V8's slow path, so only where there is something to remove.
    if (headers[hintHeader] !== undefined) delete headers[hintHeader];
    if (headers[header] !== undefined) delete headers[header];
    // Node answered `100 Continue` itself before this handler ran; forwarding the expectation
    // would only make http-proxy skip its `proxyReq` event, where timeouts are armed.
    if (headers.expect !== undefined) delete headers.expect;
    this.admit(req, res, next, route);
  }

  /**
   * Admission, before the body is read: the tenant and the priority class are taken (the class
   * header removed). The token budget and capacity are judged at {@link assign}, where the body
   * is in hand and an endpoint has been chosen. Without `admission`: straight on.
   */
  admit(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    try {
      // `undefined` when answered there (a tenant key too long).
      if (this.admission !== undefined && (route.ticket = this.admission.admit(req, res, route.trusted)) === undefined) return;
    } catch (error) {
      // The user's tenant or trust function threw.
      next(error);
      return;
    }
    this.readBody(req, res, next, route);
  }

  /**
   * Reads the body when routing needs it (into `route.body`, its members into `route.view`), or
   * buffers it (`requestBuffering`, dpRouter), then decides: a rank is picked, and a connection
   * opened, only for a request that has arrived.
   */
  readBody(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    // Routing by model reads the body only once some upstream's models tell the pools apart.
    const wantsBody = this.inputs.wantsBody(req) || this.pools.active;
    const bodied = hasBody(route.headers);
    // Each property of `req` read costs a lookup V8 cannot cache: a stream that has ended is
    // complete, so `readableEnded` is read only for a complete body.
    if (bodied && !req.complete) {
      const routes = wantsBody && isJson(route.headers);
      if (this.takesArrived && (routes || this.bufferMaxBytes > 0)) {
        // This handler runs inside the HTTP parser, before it reads on: a body sent with its
        // headers is in the stream's buffer one tick later, and taken from there at once
        // (arrivedBody).
        process.nextTick(afterParse, this, req, res, next, route, routes);
        return;
      }
      this.takeBody(req, res, next, route, routes);
      return;
    } else if (bodied && req.readableEnded) {
      // A body parser ran first: the stream is spent, so its result is all there is to read
      // and to forward.
      if (replayParsedBody(req, route) && !this.warnedParsedBody) {
        this.warnedParsedBody = true;
        this.config.logger.warn(PARSED_BODY_NOTICE);
      }
      if (wantsBody) route.view = this.inputs.parsedBodyView(req, route.body);
      this.decide(req, res, next, route);
      return;
    } else if (bodied) {
      this.takeBody(req, res, next, route, wantsBody && isJson(route.headers));
      return;
    }
    this.decide(req, res, next, route);
  }

  /**
   * Reads the body for routing (`routes`: a JSON body routing needs) or buffers it, once the
   * parser has had its turn; a body still arriving gets its deadline (`timeouts.bodyMs`).
   */
  takeBody(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, routes: boolean): void {
    if (!routes && this.passesArrived && wholeInBuffer(req, route.headers, this.bufferMaxBytes)) {
      // Buffering would wait for nothing: the body came with the headers, and the proxy sends
      // it on from the stream's buffer (reading it out costs more than the rest of buffering).
      this.decide(req, res, next, route);
      return;
    }
    // A client that left during the parser's turn is found by the read (`res.destroyed`); its
    // response's close, still to come, clears the deadline.
    if (!req.complete) route.armBodyDeadline(req, res, this.bodyTimeoutMs, this.bodies.timedOut);
    if (routes) this.bodies.read(req, res, route, this.config.maxBodyBytes, 'routing', next, this.routed, this.takesArrived);
    else if (this.bufferMaxBytes > 0) this.bodies.read(req, res, route, this.bufferMaxBytes, 'buffer', next, this.buffered, this.takesArrived);
    else this.decide(req, res, next, route);
  }

  /** The hinted rank, a rejection, a 503, or the policy's pick among the candidates. */
  decide(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    if (res.destroyed) return;
    const { inputs } = this;
    const body = route.view;
    if (body !== undefined && this.pools.active && !this.choosePool(req, res, route, body)) return;
    route.hintFields = inputs.hintFields(body);
    // vLLM ignores the rank header on this path: no rank is claimed, and hints play no part.
    if (balancedByVllm(req.originalUrl ?? req.url ?? '/', body?.members)) return this.assignBalanced(req, res, next, route, this.balancing.pick(route));
    const verdict = route.headerHint === NO_HINT ? inputs.bodyHint(body, route.trusted) : route.headerHint;
    if (verdict.outcome !== 'none') this.metrics.hint(verdict.outcome);
    // Judged available: the rank has a healthy replica (in a model's pool, it may have none there: the policy picks).
    const hinted = verdict.outcome !== 'accepted' ? undefined : route.pool === undefined ? this.table.leastLoadedOfRank(verdict.rank!) : leastLoadedOfRank(route.pool, verdict.rank!);
    if (hinted !== undefined) {
      this.assign(req, res, next, route, hinted, 'hint', 'accepted', undefined, undefined);
      return;
    }
    if (this.hints.onInvalid === 'reject' && verdict.outcome !== 'none' && verdict.outcome !== 'untrusted' && verdict.outcome !== 'accepted') {
      this.reject(res, verdict);
      return;
    }
    const candidates = this.candidates(req, route);
    // An upstream whose rank header is not honoured takes requests as vLLM balances them, by load.
    const instead = this.table.unhonouredBalanced().length === 0 ? undefined : this.balancing.instead(route, candidates);
    if (instead !== undefined || candidates.length === 0) {
      this.assignBalanced(req, res, next, route, instead);
      return;
    }
    const { policy } = this;
    const affinityKey = policy.usesAffinityKey ? inputs.affinityKey(req, body, route.lease) : undefined;
    const prompt = policy.usesPrompt && body !== undefined ? inputs.prompt(body, route.lease) : undefined;
    // A policy that reads nothing of it gets one shared context: no object, and no read of
    // `req` (each costs a lookup V8 cannot cache).
    const context: PickContext = !policy.readsContext && affinityKey === undefined && prompt === undefined ? UNREAD_CONTEXT : { path: req.originalUrl ?? req.url ?? '/', affinityKey, prompt };
    // A retry picks again among other candidates: without this pick's exact view of these.
    route.context = context;
    let picking: PrefixPickContext = this.exact !== undefined && prompt !== undefined ? exactContext(this.exact!, context, body!, route, candidates, req) : context;
    const { hooks } = this;
    for (let i = 0; i < hooks.picking.length; i++) picking = hooks.picking[i].picking!(route, req, picking, body?.bytes ?? route.body, body?.members);
    let found: PickResult<RouteEndpoint>;
    try {
      found = policy.pick(candidates, picking);
    } catch (error) {
      next(error);
      return;
    }
    const chosen = found.endpoint;
    if (!candidates.includes(chosen)) {
      next(new PolicyError(policy.name, 'returned an endpoint that was not among the candidates'));
      return;
    }
    for (let i = 0; i < hooks.refuses.length; i++) if (hooks.refuses[i].refuses!(route, res)) return;
    // The result is the policy's until its next pick, which may come while this request waits for admission.
    route.matchedShare = found.matchedShare ?? 0;
    for (let i = 0; i < hooks.decided.length; i++) hooks.decided[i].decided!(route, found, picking, body?.members, prompt !== undefined);
    const index = found.index;
    let note = this.namesIndex ? `; index=${index}` : undefined;
    if (this.config.exposeDecision) for (let i = 0; i < hooks.note.length; i++) note = (note ?? '') + hooks.note[i].note!(route);
    this.assign(req, res, next, route, chosen, 'assigned', verdict.outcome === 'none' ? undefined : verdict.outcome, note, this.reportsShare && prompt !== undefined ? index : undefined);
  }

  /**
   * A balanced endpoint takes the request, or 503 without one. It holds no rank's slot (no
   * admission seat) and tells no model preference: nothing records a choice vLLM makes.
   */
  private assignBalanced(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, endpoint: RouteEndpoint | undefined): void {
    if (endpoint === undefined) return sendError(res, 503, 'ServiceUnavailableError', 'No healthy data-parallel endpoint is available.');
    this.admission?.admitted();
    route.assign(req, res, endpoint, 'assigned', undefined);
    this.terminal.proceed(req, res, next, route);
  }

  /**
   * The endpoints the policy may pick from: the healthy ones. The one place a request's own
   * restrictions (a model pool, say) narrow them; an empty list is answered 503.
   */
  candidates(_req: RoutedRequest, route: RouteState): readonly RouteEndpoint[] {
    return route.pool ?? this.table.healthy();
  }

  /**
   * The model pool of a request whose JSON body names its model (`route.pool`, `route.model`);
   * false when it was answered instead: 400 without a string `model` where one is needed, 404
   * for a model no upstream serves.
   */
  private choosePool(req: RoutedRequest, res: ServerResponse, route: RouteState, body: BodyView): boolean {
    const model = this.inputs.model(body);
    const pool = this.models.candidatesFor(res, req.originalUrl ?? req.url ?? '/', model);
    if (pool === undefined) return false;
    route.pool = pool;
    if (typeof model === 'string') route.model = model;
    return true;
  }

  /**
   * The request takes its endpoint (`note` goes into the decision header; `scored`: the index
   * the policy's pick was scored on, reported with its matched share), then goes to the terminal.
   */
  assign(
    req: RoutedRequest,
    res: ServerResponse,
    next: Next,
    route: RouteState,
    endpoint: RouteEndpoint,
    source: DecisionSource,
    outcome: HintOutcome | undefined,
    note: string | undefined,
    scored: IndexSource | undefined,
  ): void {
    const { admission } = this;
    if (admission !== undefined) {
      // With a token budget, the request's estimate is reserved first (or it is answered 429).
      if (admission.counts) admission.reserve(res, route, () => this.seat(req, res, next, route, endpoint, source, outcome, note, scored));
      else this.seat(req, res, next, route, endpoint, source, outcome, note, scored);
      return;
    }
    route.assign(req, res, endpoint, source, outcome, note);
    // After the decision, on whose span it is recorded.
    if (scored !== undefined) this.events.prefixScored(req, scored, route.matchedShare);
    if (route.model !== undefined) this.models.sent(route.model, endpoint);
    this.terminal.proceed(req, res, next, route);
  }

  /** Capacity, under admission ({@link Gate.seat}); the decision header carries the time waited. */
  private seat(
    req: RoutedRequest,
    res: ServerResponse,
    next: Next,
    route: RouteState,
    chosen: RouteEndpoint,
    source: DecisionSource,
    outcome: HintOutcome | undefined,
    note: string | undefined,
    scored: IndexSource | undefined,
  ): void {
    const admission = this.admission!;
    const go = this.tracing.keep((endpoint: RouteEndpoint) => {
      const ticket = route.ticket!;
      const waitedMs = Math.round(ticket.waitedMs);
      route.assign(req, res, endpoint, source, outcome, `${note ?? ''}; waited_ms=${waitedMs}`);
      if (scored !== undefined) this.events.prefixScored(req, scored, route.matchedShare);
      if (route.model !== undefined) this.models.sent(route.model, endpoint);
      this.tracing.admitted(req, admission.settings.classes[ticket.priority], waitedMs);
      this.terminal.proceed(req, res, next, route);
    });
    const leave = admission.seat(res, route, chosen, source === 'hint', (free) => this.pickFree(route, free), go, next);
    if (leave !== undefined) route.queued(res, leave);
  }

  /** The policy's pick among endpoints with room (the first, should the policy fail); `undefined` when none has room. */
  private pickFree(route: RouteState, anywhere: readonly RouteEndpoint[]): RouteEndpoint | undefined {
    // Only where this request may go: its model's pool.
    const { pool } = route;
    const free = pool === undefined ? anywhere : anywhere.filter((endpoint) => pool.includes(endpoint));
    if (free.length === 0) return undefined;
    // The span keeps the decision's share, which its receipt was predicted with.
    return safePick(this.policy, free, route.context ?? bareContext('/')) ?? free[0];
  }

  private reject(res: ServerResponse, verdict: JudgedHint): void {
    const answer = hintRejection(verdict, 'data-parallel', this.table.routableRanks);
    sendError(res, answer.status, answer.type, answer.message, answer.param);
  }
}

/** The lifecycle's next step once the parser has had its turn (a function, so that `process.nextTick` takes it with arguments and no closure). */
function afterParse(lifecycle: RequestLifecycle, req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState, routes: boolean): void {
  lifecycle.takeBody(req, res, next, route, routes);
}
