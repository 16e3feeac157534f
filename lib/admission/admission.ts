import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { sendError } from '../errors';
import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import { FairQueue, type Waiter } from './fair-queue';
import { TokenBudget, type Reservation } from './budget';
import { reservationOf } from './estimate';
import type { AdmissionMetrics } from './metrics';
import { MAX_TENANT_LENGTH, type AdmissionSettings } from './options';
import { tapUsage } from './usage-tap';

/** What admission knows of one request, from its admission to its end. */
export class AdmissionTicket implements Reservation {
  /** Milliseconds waited in the queue (0: a slot was free). */
  waitedMs = 0;
  /** Request body bytes, for the token estimates. */
  requestBytes = 0;
  window = 0;
  reserved = 0;
  settled = false;
  since = 0;
  /** Whether the answer is read for its usage, which settles the reservation when it ends. */
  tapped = false;
  /** With `slo`: by when the request should start, arrival + its TTFT objective (ms, `performance.now()`); Infinity for none. */
  deadline = Infinity;
  constructor(
    readonly tenant: string,
    /** Index into the configured classes. */
    readonly priority: number,
    /** The token budget the request reserves on; `undefined` without one. */
    private readonly budget: TokenBudget | undefined,
  ) {}

  /** The request's response closed: a reservation whose answer is not read is refunded (an error answer, a refusal, a client that left). */
  ended(): void {
    if (!this.tapped) this.budget?.settle(this, 0);
  }
}

/** Where a released waiter goes on: the endpoint it now holds a slot on is `endpoint`. */
export type Resume = (endpoint: RouteEndpoint) => void;

/** A waiting request. */
interface Seat {
  readonly ticket: AdmissionTicket;
  readonly res: ServerResponse;
  /** The rank it waits for (a hint), or `undefined` for any endpoint. */
  readonly rank: number | undefined;
  /** Where it may go: its model's pool, or `undefined` for every endpoint. */
  readonly pool: readonly RouteEndpoint[] | undefined;
  /** For any endpoint: the policy's pick among the free ones. */
  readonly choose: ((free: readonly RouteEndpoint[]) => RouteEndpoint | undefined) | undefined;
  readonly resume: Resume;
  readonly since: number;
  timer: NodeJS.Timeout | undefined;
}

/** What the token budget reads of a request whose body is in hand (the request's route state). */
export interface BodyInHand {
  readonly ticket: AdmissionTicket | undefined;
  /** The body, when the router holds it. */
  readonly body: Buffer | undefined;
  /** The first bytes of a body streamed after buffering stopped. */
  readonly bodyHead: Buffer | undefined;
  /** The body's members, when routing decoded it whole. */
  readonly view?: { readonly members: Readonly<Record<string, unknown>> | undefined } | undefined;
  readonly headers: IncomingHttpHeaders;
}

/** What admission reports to besides its metrics. */
export interface AdmissionReports {
  readonly metrics: AdmissionMetrics;
  warn(message: string): void;
  /** A fault the operator must fix, at error level. */
  error(message: string): void;
}

const DEFAULT_TENANT = '';

/**
 * The admission stage: who the request is for (tenant, class) before anything is read; its
 * token budget once its body is in hand (a reservation, settled when the answer ends); and
 * whether an endpoint has room when one is chosen. A request that finds none waits in a
 * fair queue until a slot frees. Requests waiting for any endpoint share one queue; those
 * waiting for a hinted rank wait in that rank's own, and a freed slot goes to the first waiter
 * of the two that can use it (its model's pool holds the endpoint), the higher class first,
 * then the older.
 */
export class Admission {
  private readonly anyEndpoint: FairQueue<Seat>;
  private readonly byRank = new Map<number, FairQueue<Seat>>();
  private readonly perTenant = new Map<string, number>();
  private waiting = 0;
  private readonly budget: TokenBudget | undefined;
  private warnedFull = false;
  /** Releases in the current and the last whole second, for `Retry-After` when the queue is full. */
  private second = 0;
  private releasesNow = 0;
  private releasesBefore = 0;
  /** Whether answers are counted against a token budget. */
  readonly counts: boolean;

  constructor(
    readonly settings: AdmissionSettings,
    private readonly table: EndpointTable,
    private readonly reports: AdmissionReports,
  ) {
    this.anyEndpoint = new FairQueue(settings.classes.length, settings.starvationLimit);
    this.budget = settings.store === undefined ? undefined : new TokenBudget(settings.store, settings.tokensPerMinute!, { storeFailed: () => reports.metrics.storeFailed(), warn: reports.warn, error: reports.error });
    this.counts = this.budget !== undefined;
  }

  /**
   * Takes the request's tenant and class (the class header is removed whoever sent it), before
   * its body is read; `undefined` when it was answered here (a tenant key too long: 400).
   */
  admit(req: IncomingMessage, res: ServerResponse, trusted: boolean): AdmissionTicket | undefined {
    const tenant = this.tenantOf(req, trusted);
    if (tenant === undefined) {
      sendError(res, 400, 'BadRequestError', `The tenant key must be at most ${MAX_TENANT_LENGTH} characters.`, this.settings.tenantHeader ?? null);
      return undefined;
    }
    return new AdmissionTicket(tenant, this.priorityOf(req, trusted), this.budget);
  }

  /**
   * The token budget, once the request's body is in hand: its estimate (from the bytes read:
   * the body the router holds, else its `Content-Length`, else what was read of it before it was
   * streamed) is reserved when the tenant's use is below the budget, atomically in the store, so
   * that concurrent requests see each other; then `go()`. Over budget: 429 with `Retry-After`.
   * The reservation settles when the answer ends ({@link count}) or the response closes
   * ({@link AdmissionTicket.ended}).
   */
  reserve(res: ServerResponse, request: BodyInHand, go: () => void): void {
    const ticket = request.ticket!;
    const { body } = request;
    const requestBytes = (ticket.requestBytes = body?.length ?? (Number(request.headers['content-length']) || request.bodyHead?.length || 0));
    const budget = this.budget!;
    const verdict = budget.reserve(ticket, reservationOf(requestBytes, body, request.view?.members));
    if (!(verdict instanceof Promise)) {
      this.judged(res, verdict, go);
      return;
    }
    verdict.then((seconds) => {
      if (!res.destroyed) this.judged(res, seconds, go);
      else budget.settle(ticket, 0);
    });
  }

  /** Whether `endpoint` has no room (see docs/operating.md on load feedback). */
  full(endpoint: RouteEndpoint): boolean {
    // An engine that reports requests waiting in its own queue has no free seat, whatever this
    // router counts; it still gets one of ours at a time, so that a release always comes to
    // wake the queue and a stale scrape cannot stall it.
    return endpoint.inflight >= this.settings.maxInflightPerRank || (endpoint.engineWaiting > 0 && endpoint.inflight > 0);
  }

  /** The least loaded replica of `rank` with room, if any (in `pool`, a model's endpoints, when given). */
  freeOfRank(rank: number, pool: readonly RouteEndpoint[] | undefined): RouteEndpoint | undefined {
    let best: RouteEndpoint | undefined;
    for (const replica of this.table.healthyOfRank(rank)) {
      if (this.full(replica) || (pool !== undefined && !pool.includes(replica))) continue;
      if (best === undefined || replica.load < best.load) best = replica;
    }
    return best;
  }

  /** Every healthy endpoint with room. */
  free(): RouteEndpoint[] {
    return this.table.healthy().filter((endpoint) => !this.full(endpoint));
  }

  /**
   * Queues a request that found no room: for `rank` (a hint: it waits for that rank), or for
   * any endpoint, where `choose` picks among those free when a slot frees; `pool`, its model's
   * endpoints, bounds both. Answers 429 when the queue or the tenant's share of it is full.
   * Returns the cancel to call if the client leaves.
   */
  wait(res: ServerResponse, ticket: AdmissionTicket, rank: number | undefined, pool: Seat['pool'], choose: Seat['choose'], resume: Resume): (() => void) | undefined {
    const { settings } = this;
    const tenantWaiting = this.perTenant.get(ticket.tenant) ?? 0;
    if (this.waiting >= settings.maxLength || tenantWaiting >= settings.maxPerTenant) {
      this.refuseFull(res, this.waiting >= settings.maxLength);
      this.budget?.settle(ticket, 0);
      return undefined;
    }
    const queue = rank === undefined ? this.anyEndpoint : this.rankQueue(rank);
    const seat: Seat = { ticket, res, rank, pool, choose, resume, since: performance.now(), timer: undefined };
    const waiter = queue.push(seat, ticket.tenant, ticket.priority, undefined, ticket.deadline);
    seat.timer = setTimeout(() => this.expire(queue, waiter), settings.timeoutMs);
    this.waiting++;
    this.perTenant.set(ticket.tenant, tenantWaiting + 1);
    this.reports.metrics.depth(settings.classes[ticket.priority], 1);
    return () => {
      if (this.leave(queue, waiter)) this.reports.metrics.outcome('cancelled');
    };
  }

  /**
   * Capacity for a request that chose `chosen`: it goes on there when it has room; else, for a
   * hint (`hinted`), on the least loaded replica of its rank with room (in its model's pool), and for a pick, on
   * `choose`'s pick among the endpoints with room; else it waits in the fair queue (a hint for
   * its rank: it is never moved) and goes on where a slot frees. `go` is called with the
   * endpoint, now or later (`failed` takes what it throws then). Returns the cancel of a wait.
   */
  seat(
    res: ServerResponse,
    request: { ticket: AdmissionTicket | undefined; leave: (() => void) | undefined; pool: Seat['pool'] },
    chosen: RouteEndpoint,
    hinted: boolean,
    choose: (free: readonly RouteEndpoint[]) => RouteEndpoint | undefined,
    go: (endpoint: RouteEndpoint) => void,
    failed: (error: unknown) => void,
  ): (() => void) | undefined {
    const now = this.full(chosen) ? (hinted ? this.freeOfRank(chosen.rank, request.pool) : choose(this.free())) : chosen;
    if (now !== undefined) {
      this.admitted();
      go(now);
      return undefined;
    }
    return this.wait(res, request.ticket!, hinted ? chosen.rank : undefined, request.pool, hinted ? undefined : choose, (endpoint) => {
      request.leave = undefined;
      try {
        go(endpoint);
      } catch (error) {
        failed(error);
      }
    });
  }

  /** Counts a request that went on without waiting. */
  admitted(): void {
    this.reports.metrics.outcome('admitted');
  }

  /**
   * A slot on `endpoint` was freed: it goes to the first waiter, in each queue's own order, that
   * can use it (its model's pool holds the endpoint), the one of this rank's queue or the shared
   * one that goes first by class, then age; as long as the endpoint has room. A waiter for a busy
   * model at the head never holds back one behind it for this endpoint's model.
   */
  freed(endpoint: RouteEndpoint): void {
    if (this.waiting === 0) return;
    this.countRelease();
    const ranked = this.byRank.get(endpoint.rank);
    const fits = (seat: Seat) => seat.pool === undefined || seat.pool.includes(endpoint);
    while (this.waiting > 0 && endpoint.healthy && !this.full(endpoint)) {
      const mine = ranked?.first(fits);
      const any = this.anyEndpoint.first(fits);
      const next = mine === undefined ? any : any === undefined ? mine : before(mine, any) ? mine : any;
      if (next === undefined) return;
      const seat = next.value;
      // Never undefined: `endpoint` is free and in the waiter's pool (and of its rank, for a hint).
      const target = seat.rank === undefined ? seat.choose!(this.free()) : this.freeOfRank(seat.rank, seat.pool);
      if (target === undefined) return;
      this.leave(next === mine ? ranked! : this.anyEndpoint, next, true);
      const waitedMs = performance.now() - seat.since;
      seat.ticket.waitedMs = waitedMs;
      this.reports.metrics.outcome('queued');
      this.reports.metrics.waited(this.settings.classes[seat.ticket.priority], waitedMs / 1000);
      seat.resume(target);
    }
  }

  /** Settles the ticket's reservation to the tokens `answer` used, once it ends (a 2xx answer; any other is refunded when the response closes). */
  count(ticket: AdmissionTicket, answer: IncomingMessage): void {
    const status = answer.statusCode ?? 0;
    if (status < 200 || status >= 300 || ticket.tapped || ticket.settled) return;
    ticket.tapped = true;
    const budget = this.budget!;
    tapUsage(answer, ticket.requestBytes, (tokens) => budget.settle(ticket, tokens));
  }

  /** The router closes: every waiting request is answered 503 and its timer stopped. */
  close(): void {
    for (const queue of [this.anyEndpoint, ...this.byRank.values()]) {
      for (let waiter = queue.peek(); waiter !== undefined; waiter = queue.peek()) {
        this.leave(queue, waiter);
        sendError(waiter.value.res, 503, 'ServiceUnavailableError', 'The router is closing.');
      }
    }
  }

  /** Requests waiting now. */
  get depth(): number {
    return this.waiting;
  }

  /** Tenants with requests waiting now. */
  get tenantsWaiting(): number {
    return this.perTenant.size;
  }

  private judged(res: ServerResponse, retryAfter: number | undefined, go: () => void): void {
    if (retryAfter === undefined) {
      go();
      return;
    }
    this.reports.metrics.outcome('over_budget');
    res.setHeader('retry-after', String(retryAfter));
    sendError(res, 429, 'RateLimitError', `The token budget of ${this.settings.tokensPerMinute} tokens per minute is spent; retry after ${retryAfter} s.`);
  }

  /** The request's tenant: an untrusted caller's header is ignored (the default tenant); `undefined` for a key too long. */
  private tenantOf(req: IncomingMessage, hintsTrusted: boolean): string | undefined {
    const { tenantHeader, tenantOf } = this.settings;
    let tenant: unknown;
    if (tenantHeader !== undefined) {
      const raw = req.headers[tenantHeader];
      if (raw === undefined || !trustedBy(this.settings.tenantTrust, req, hintsTrusted)) return DEFAULT_TENANT;
      tenant = raw;
    } else if (tenantOf !== undefined) {
      tenant = tenantOf(req);
    }
    if (typeof tenant !== 'string' || tenant.length === 0) return DEFAULT_TENANT;
    return tenant.length > MAX_TENANT_LENGTH ? undefined : tenant;
  }

  private priorityOf(req: IncomingMessage, hintsTrusted: boolean): number {
    const { priorityHeader, priorityTrust, classes, defaultClass } = this.settings;
    if (priorityHeader === undefined) return defaultClass;
    const raw = req.headers[priorityHeader];
    if (raw === undefined) return defaultClass;
    delete req.headers[priorityHeader];
    if (!trustedBy(priorityTrust, req, hintsTrusted) || typeof raw !== 'string') return defaultClass;
    const index = classes.indexOf(raw.trim().toLowerCase());
    return index === -1 ? defaultClass : index;
  }

  private rankQueue(rank: number): FairQueue<Seat> {
    let queue = this.byRank.get(rank);
    if (queue === undefined) {
      queue = new FairQueue(this.settings.classes.length, this.settings.starvationLimit);
      this.byRank.set(rank, queue);
    }
    return queue;
  }

  /** Takes a waiter out of its queue; false when it was gone already. */
  private leave(queue: FairQueue<Seat>, waiter: Waiter<Seat>, served = false): boolean {
    if (!waiter.waiting) return false;
    if (served) queue.take(waiter);
    else queue.remove(waiter);
    const { ticket, timer } = waiter.value;
    clearTimeout(timer);
    this.waiting--;
    const left = this.perTenant.get(ticket.tenant)! - 1;
    if (left === 0) this.perTenant.delete(ticket.tenant);
    else this.perTenant.set(ticket.tenant, left);
    this.reports.metrics.depth(this.settings.classes[ticket.priority], -1);
    if (this.waiting === 0) this.warnedFull = false;
    return true;
  }

  private expire(queue: FairQueue<Seat>, waiter: Waiter<Seat>): void {
    if (!this.leave(queue, waiter)) return;
    this.reports.metrics.outcome('timed_out');
    const seat = waiter.value;
    sendError(seat.res, 503, 'ServiceUnavailableError', `No data-parallel endpoint had room within ${this.settings.timeoutMs} ms (admission.queue.timeoutMs).`);
  }

  private refuseFull(res: ServerResponse, total: boolean): void {
    const { settings } = this;
    this.reports.metrics.outcome('queue_full');
    if (total && !this.warnedFull) {
      this.warnedFull = true;
      this.reports.warn(`express-dp-router: the admission queue is full (${settings.maxLength} waiting); answering 429 until it drains.`);
    }
    res.setHeader('retry-after', String(this.retryAfter()));
    const what = total ? `The admission queue is full (${settings.maxLength} waiting)` : `This tenant already has ${settings.maxPerTenant} requests waiting`;
    sendError(res, 429, 'RateLimitError', `${what}; retry later.`);
  }

  /** Whole seconds (≥ 1, at most the queue timeout) until the queue has drained at the recent release rate. */
  private retryAfter(): number {
    this.countRelease(0);
    const rate = Math.max(this.releasesBefore, this.releasesNow, 1);
    return Math.max(1, Math.min(Math.ceil(this.settings.timeoutMs / 1000), Math.ceil(this.waiting / rate)));
  }

  private countRelease(count = 1): void {
    const second = Math.floor(performance.now() / 1000);
    if (second !== this.second) {
      this.releasesBefore = second === this.second + 1 ? this.releasesNow : 0;
      this.releasesNow = 0;
      this.second = second;
    }
    this.releasesNow += count;
  }
}

/** Whether `trust` (`undefined`: the rank hints' rule, already judged as `hintsTrusted`) trusts the caller. */
function trustedBy(trust: AdmissionSettings['tenantTrust'], req: IncomingMessage, hintsTrusted: boolean): boolean {
  return trust === undefined ? hintsTrusted : trust === true || (trust !== false && trust(req) === true);
}

/** Which of two heads goes first: the higher class, then the older. */
function before(a: Waiter<Seat>, b: Waiter<Seat>): boolean {
  return a.priority !== b.priority ? a.priority < b.priority : a.value.since <= b.value.since;
}
