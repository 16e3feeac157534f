import type { IncomingMessage, ServerResponse } from 'node:http';
import { sendError } from '../errors';
import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import { FairQueue, type Waiter } from './fair-queue';
import { TokenBudget } from './budget';
import type { AdmissionMetrics } from './metrics';
import { MAX_TENANT_LENGTH, type AdmissionSettings } from './options';
import { tapUsage } from './usage-tap';

/** What admission knows of one request, from its admission to its end. */
export class AdmissionTicket {
  /** Milliseconds waited in the queue (0: a slot was free). */
  waitedMs = 0;
  constructor(
    readonly tenant: string,
    /** Index into the configured classes. */
    readonly priority: number,
  ) {}
}

/** Where a released waiter goes on: the endpoint it now holds a slot on is `endpoint`. */
export type Resume = (endpoint: RouteEndpoint) => void;

/** A waiting request. */
interface Seat {
  readonly ticket: AdmissionTicket;
  readonly res: ServerResponse;
  /** The rank it waits for (a hint), or `undefined` for any endpoint. */
  readonly rank: number | undefined;
  /** For any endpoint: the policy's pick among the free ones. */
  readonly choose: ((free: readonly RouteEndpoint[]) => RouteEndpoint | undefined) | undefined;
  readonly resume: Resume;
  readonly since: number;
  timer: NodeJS.Timeout | undefined;
}

/** What admission reports to besides its metrics. */
export interface AdmissionReports {
  readonly metrics: AdmissionMetrics;
  warn(message: string): void;
}

const DEFAULT_TENANT = '';

/**
 * The admission stage: who the request is for (tenant, class, budget) before anything is read,
 * and whether an endpoint has room when one is chosen; a request that finds none waits in a
 * fair queue until a slot frees. Requests waiting for any endpoint share one queue; those
 * waiting for a hinted rank wait in that rank's own, and a freed slot goes to the older head
 * of the two (the higher class first).
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
    this.budget = settings.store === undefined ? undefined : new TokenBudget(settings.store, settings.tokensPerMinute!, { storeFailed: () => reports.metrics.storeFailed(), warn: reports.warn });
    this.counts = this.budget !== undefined;
  }

  /**
   * Takes the request's tenant and class (the class header is removed whoever sent it) and
   * checks its token budget; then `go(ticket)`, unless it was answered here (a tenant key too
   * long: 400; over budget: 429).
   */
  admit(req: IncomingMessage, res: ServerResponse, trusted: boolean, go: (ticket: AdmissionTicket) => void): void {
    const { settings } = this;
    const tenant = this.tenantOf(req);
    if (tenant === undefined) {
      sendError(res, 400, 'BadRequestError', `The tenant key must be at most ${MAX_TENANT_LENGTH} characters.`, settings.tenantHeader ?? null);
      return;
    }
    const ticket = new AdmissionTicket(tenant, this.priorityOf(req, trusted));
    const budget = this.budget;
    if (budget === undefined) {
      go(ticket);
      return;
    }
    const verdict = budget.check(tenant);
    if (!(verdict instanceof Promise)) {
      this.judged(res, ticket, verdict, go);
      return;
    }
    verdict.then((seconds) => {
      if (!res.destroyed) this.judged(res, ticket, seconds, go);
    });
  }

  /** Whether `endpoint` has no room (see docs/operating.md on load feedback). */
  full(endpoint: RouteEndpoint): boolean {
    // An engine that reports requests waiting in its own queue has no free seat, whatever this
    // router counts; it still gets one of ours at a time, so that a release always comes to
    // wake the queue and a stale scrape cannot stall it.
    return endpoint.inflight >= this.settings.maxInflightPerRank || (endpoint.engineWaiting > 0 && endpoint.inflight > 0);
  }

  /** The least loaded replica of `rank` with room, if any. */
  freeOfRank(rank: number): RouteEndpoint | undefined {
    let best: RouteEndpoint | undefined;
    for (const replica of this.table.healthyOfRank(rank)) {
      if (this.full(replica)) continue;
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
   * any endpoint, where `choose` picks among those free when a slot frees. Answers 429 when the
   * queue or the tenant's share of it is full. Returns the cancel to call if the client leaves.
   */
  wait(res: ServerResponse, ticket: AdmissionTicket, rank: number | undefined, choose: Seat['choose'], resume: Resume): (() => void) | undefined {
    const { settings } = this;
    const tenantWaiting = this.perTenant.get(ticket.tenant) ?? 0;
    if (this.waiting >= settings.maxLength || tenantWaiting >= settings.maxPerTenant) {
      this.refuseFull(res, this.waiting >= settings.maxLength);
      return undefined;
    }
    const queue = rank === undefined ? this.anyEndpoint : this.rankQueue(rank);
    const seat: Seat = { ticket, res, rank, choose, resume, since: performance.now(), timer: undefined };
    const waiter = queue.push(seat, ticket.tenant, ticket.priority);
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
   * hint (`hinted`), on the least loaded replica of its rank with room, and for a pick, on
   * `choose`'s pick among the endpoints with room; else it waits in the fair queue (a hint for
   * its rank: it is never moved) and goes on where a slot frees. `go` is called with the
   * endpoint, now or later (`failed` takes what it throws then). Returns the cancel of a wait.
   */
  seat(
    res: ServerResponse,
    request: { ticket: AdmissionTicket | undefined; leave: (() => void) | undefined },
    chosen: RouteEndpoint,
    hinted: boolean,
    choose: (free: readonly RouteEndpoint[]) => RouteEndpoint | undefined,
    go: (endpoint: RouteEndpoint) => void,
    failed: (error: unknown) => void,
  ): (() => void) | undefined {
    const now = this.full(chosen) ? (hinted ? this.freeOfRank(chosen.rank) : choose(this.free())) : chosen;
    if (now !== undefined) {
      this.admitted();
      go(now);
      return undefined;
    }
    return this.wait(res, request.ticket!, hinted ? chosen.rank : undefined, hinted ? undefined : choose, (endpoint) => {
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
   * A slot on `endpoint` was freed: it goes to the next waiter that can use it (the older head
   * of this rank's queue and the shared one, by class first), as long as the endpoint has room.
   */
  freed(endpoint: RouteEndpoint): void {
    if (this.waiting === 0) return;
    this.countRelease();
    const ranked = this.byRank.get(endpoint.rank);
    while (this.waiting > 0 && endpoint.healthy && !this.full(endpoint)) {
      const mine = ranked?.peek();
      const any = this.anyEndpoint.peek();
      const next = mine === undefined ? any : any === undefined ? mine : before(mine, any) ? mine : any;
      if (next === undefined) return;
      const seat = next.value;
      const target = seat.rank === undefined ? seat.choose!(this.free()) : this.freeOfRank(seat.rank);
      if (target === undefined) return;
      this.leave(next === mine ? ranked! : this.anyEndpoint, next, true);
      const waitedMs = performance.now() - seat.since;
      seat.ticket.waitedMs = waitedMs;
      this.reports.metrics.outcome('queued');
      this.reports.metrics.waited(this.settings.classes[seat.ticket.priority], waitedMs / 1000);
      seat.resume(target);
    }
  }

  /** Counts the tokens of `answer` against the ticket's tenant once it ends. */
  count(ticket: AdmissionTicket, req: IncomingMessage, answer: IncomingMessage): void {
    const status = answer.statusCode ?? 0;
    if (status < 200 || status >= 300) return;
    const budget = this.budget!;
    tapUsage(answer, Number(req.headers['content-length']) || 0, (tokens) => budget.add(ticket.tenant, tokens));
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

  private judged(res: ServerResponse, ticket: AdmissionTicket, retryAfter: number | undefined, go: (ticket: AdmissionTicket) => void): void {
    if (retryAfter === undefined) {
      go(ticket);
      return;
    }
    this.reports.metrics.outcome('over_budget');
    res.setHeader('retry-after', String(retryAfter));
    sendError(res, 429, 'RateLimitError', `The token budget of ${this.settings.tokensPerMinute} tokens per minute is spent; retry after ${retryAfter} s.`);
  }

  private tenantOf(req: IncomingMessage): string | undefined {
    const { tenantHeader, tenantOf } = this.settings;
    let tenant: unknown;
    if (tenantHeader !== undefined) tenant = req.headers[tenantHeader];
    else if (tenantOf !== undefined) tenant = tenantOf(req);
    if (typeof tenant !== 'string' || tenant.length === 0) return DEFAULT_TENANT;
    return tenant.length > MAX_TENANT_LENGTH ? undefined : tenant;
  }

  private priorityOf(req: IncomingMessage, hintsTrusted: boolean): number {
    const { priorityHeader, priorityTrust, classes, defaultClass } = this.settings;
    if (priorityHeader === undefined) return defaultClass;
    const raw = req.headers[priorityHeader];
    if (raw === undefined) return defaultClass;
    delete req.headers[priorityHeader];
    const trusted = priorityTrust === undefined ? hintsTrusted : priorityTrust === true || (priorityTrust !== false && priorityTrust(req) === true);
    if (!trusted || typeof raw !== 'string') return defaultClass;
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

/** Which of two heads goes first: the higher class, then the older. */
function before(a: Waiter<Seat>, b: Waiter<Seat>): boolean {
  return a.priority !== b.priority ? a.priority < b.priority : a.value.since <= b.value.since;
}
