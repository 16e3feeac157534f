import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { UpstreamErrorKind } from '../types';
import type { PrefixPickContext } from '../policies/prefix-aware';
import type { RouteEndpoint } from '../upstreams/endpoints';
import type { PickResult } from '../policies/pick-result';

/** A request's state as the points pass it (request/route-state.ts's `RouteState`). */
export type RouteView = object;

/**
 * What a feature does at each point of a request's way (docs/architecture.md). Every method is
 * optional; a feature implements the points it acts at. The core (the lifecycle, the route
 * state, the forwarder) calls each point's list in registration order and names no feature.
 *
 * A feature's hooks object is built once per router (compose/features.ts) and holds its
 * service; per-request state a feature needs rides on the request's state (`RouteState`, the `R` here).
 */
export interface RouteHooks<R = RouteView> {
  /** For logs and the order of registration only. */
  readonly name: string;
  /**
   * At the front, before anything else reads the request's headers: a feature judges and removes
   * its own (`headers` is `req.headers`). May throw (a user's
   * trust function): the request then goes to `next(error)`.
   */
  front?(route: R, req: IncomingMessage, headers: IncomingHttpHeaders): void;
  /**
   * Before the policy picks (not for a hint, nor a path vLLM balances): the context it picks with,
   * which a feature may extend (a new object: `context` is shared). `body` is the request's body,
   * when the router holds it, and its decoded members.
   */
  picking?(route: R, req: IncomingMessage, context: PrefixPickContext, body: Buffer | undefined, members: Readonly<Record<string, unknown>> | undefined): PrefixPickContext;
  /** After the pick: true when the feature answered the request itself (nothing is sent upstream). */
  refuses?(route: R, res: ServerResponse): boolean;
  /** What the decision header (`exposeDecision`) adds for this request's pick, e.g. `; predicted_ttft_ms=42`; '' for nothing. */
  note?(route: R): string;
  /**
   * The policy picked among the candidates (not a hint, not a path vLLM balances): `found` is
   * what the pick found (the endpoint, the index, the matched share, the uncached blocks, what
   * features add), valid during this call only (the policy fills it again on its next pick:
   * copy what must outlive it onto `route`). `context` is what it picked with (its `exact`
   * view, when exact prefix routing scored the pick); `members` the body's decoded members
   * routing read; `prompted` whether the pick read a prompt. Before the request holds the endpoint.
   */
  decided?(route: R, found: PickResult<RouteEndpoint>, context: PrefixPickContext, members: Readonly<Record<string, unknown>> | undefined, prompted: boolean): void;
  /** Whether the rank header is sent to `endpoint` (a router's pick; a hint always claims): false from any feature withholds it. */
  claims?(route: R, endpoint: RouteEndpoint): boolean;
  /** The request took a slot on `endpoint` (its first, or a retry's), before the rank header is set. */
  held?(route: R, endpoint: RouteEndpoint): void;
  /** A retry leaves `from` (its slot freed already), before the request holds the next endpoint. */
  retrying?(route: R, from: RouteEndpoint): void;
  /** A retry left `from` and holds the next endpoint. */
  retried?(route: R, from: RouteEndpoint): void;
  /** A try is sent to `endpoint` (the first, or a retry's). */
  sending?(route: R, endpoint: RouteEndpoint, res: ServerResponse): void;
  /**
   * A try failed before an answer, or its answer was cut short (`reset`), counted once: `origin`
   * says whether the request may be its own cause (a first-byte timeout, a reset answer) or the
   * connection never reached an answer. Not for a client that left.
   */
  failed?(route: R, endpoint: RouteEndpoint, req: IncomingMessage, kind: Exclude<UpstreamErrorKind, 'status_5xx'>, origin: 'request' | 'connection'): void;
  /** The upstream began to answer (any status). */
  answered?(route: R, endpoint: RouteEndpoint, req: IncomingMessage, res: ServerResponse, answer: IncomingMessage): void;
  /**
   * A 2xx answer's first token (`streamed`: a real event of an event stream; otherwise the
   * answer's first byte, which came with its last). Watched for every request when a feature's
   * {@link watchesFirstToken} is absent, else only for requests it returns true for.
   */
  firstToken?(route: R, endpoint: RouteEndpoint, seconds: number, streamed: boolean): void;
  /** Which requests {@link firstToken} needs a scan of the answer for (absent: all). */
  watchesFirstToken?(route: R): boolean;
  /** The response closed, before anything is released (the request may hold no endpoint). Reverse registration order. */
  closing?(route: R): void;
  /** The response of a request that held `endpoint` closed; its slot is freed. `answer`: the upstream's, when there was one. Reverse registration order. */
  closed?(route: R, endpoint: RouteEndpoint, answer: IncomingMessage | null | undefined): void;
}

/**
 * The extension points of one router: for each point, the hooks registered there, in
 * registration order (`closing` and `closed` in the reverse order). Built once at creation; a request walks these arrays (no map, no
 * closure made per request).
 */
export class RouteSeam<R = RouteView> {
  readonly front: RouteHooks<R>[] = [];
  readonly picking: RouteHooks<R>[] = [];
  readonly refuses: RouteHooks<R>[] = [];
  readonly note: RouteHooks<R>[] = [];
  readonly decided: RouteHooks<R>[] = [];
  readonly claims: RouteHooks<R>[] = [];
  readonly held: RouteHooks<R>[] = [];
  readonly retrying: RouteHooks<R>[] = [];
  readonly retried: RouteHooks<R>[] = [];
  readonly sending: RouteHooks<R>[] = [];
  readonly failed: RouteHooks<R>[] = [];
  readonly answered: RouteHooks<R>[] = [];
  readonly firstToken: RouteHooks<R>[] = [];
  readonly closing: RouteHooks<R>[] = [];
  readonly closed: RouteHooks<R>[] = [];
  /** Whether some feature reads the first token of every request. */
  watchesAllFirstTokens = false;
  /** The features that read the first token of some requests only. */
  readonly watchesSomeFirstTokens: RouteHooks<R>[] = [];

  /** Registers `hooks` at each point it implements. */
  add(hooks: RouteHooks<R>): this {
    if (hooks.front) this.front.push(hooks);
    if (hooks.picking) this.picking.push(hooks);
    if (hooks.refuses) this.refuses.push(hooks);
    if (hooks.note) this.note.push(hooks);
    if (hooks.decided) this.decided.push(hooks);
    if (hooks.claims) this.claims.push(hooks);
    if (hooks.held) this.held.push(hooks);
    if (hooks.retrying) this.retrying.push(hooks);
    if (hooks.retried) this.retried.push(hooks);
    if (hooks.sending) this.sending.push(hooks);
    if (hooks.failed) this.failed.push(hooks);
    if (hooks.answered) this.answered.push(hooks);
    if (hooks.firstToken) {
      this.firstToken.push(hooks);
      if (hooks.watchesFirstToken === undefined) this.watchesAllFirstTokens = true;
      else this.watchesSomeFirstTokens.push(hooks);
    }
    // The way out releases in the reverse order of the way in: a feature registered first is
    // told last (admission frees the slot once everyone else has counted the request out).
    if (hooks.closing) this.closing.unshift(hooks);
    if (hooks.closed) this.closed.unshift(hooks);
    return this;
  }

  /** Whether `route`'s answer is scanned for its first token. */
  watchesFirstToken(route: R): boolean {
    if (this.watchesAllFirstTokens) return true;
    const some = this.watchesSomeFirstTokens;
    for (let i = 0; i < some.length; i++) if (some[i].watchesFirstToken!(route)) return true;
    return false;
  }
}
