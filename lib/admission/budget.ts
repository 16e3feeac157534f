import { StoreBreaker } from './store-breaker';
import { isCounts, NOT_A_COUNT, previousWeight, retryAfterSeconds, useOf, windowOf, type TokenStore, type WindowCounts } from './token-window';

/** How long a store may take before the request goes on without it (fail open). */
const STORE_TIMEOUT_MS = 250;
/** How long a probe may take: no request waits for it, and a client still connecting at start is not an outage. */
const PROBE_TIMEOUT_MS = 2_000;

/** What the budget reports to: the error counter and the log. */
export interface BudgetReports {
  storeFailed(): void;
  warn(message: string): void;
  /** A fault the operator must fix (the store refuses our credentials): at error level. */
  error(message: string): void;
}

/**
 * Errors by which a store refuses who we are or what we may do (Redis's `WRONGPASS`, `NOAUTH`,
 * `NOPERM`): a configuration to fix, not an outage to wait out.
 */
const REFUSED_CREDENTIALS = /^(?:WRONGPASS|NOAUTH|NOPERM)\b|invalid password/i;
/** How much each finished reservation's hold moves the typical hold time. */
const HOLD_WEIGHT = 0.2;

/** One request's hold on its tenant's budget, from its reservation to its settlement. */
export interface Reservation {
  readonly tenant: string;
  /** The fixed window the reservation was counted in. */
  window: number;
  /** Tokens reserved (0: none, the store failed or it was not reserved yet). */
  reserved: number;
  /** Whether the answer's tokens were counted (or the reservation refunded): once only. */
  settled: boolean;
  /** When it was reserved (`Date.now()` ms). */
  since: number;
}

/**
 * A per-tenant token budget over a store. A request reserves its estimate when it is admitted,
 * so that concurrent requests see each other, and settles to what its answer used when that
 * ends. A store that fails, is slow or answers something other than a count never stops
 * traffic: the request is let through (fail open), each failure counted, and the outage logged
 * once (at error level when the store refuses our credentials), with one more line when the
 * store answers again. After two failures in a row the store is not asked at all (each request
 * unchecked is counted) but by a probe a second that no request waits for ({@link StoreBreaker}).
 */
export class TokenBudget {
  private down = false;
  private readonly breaker = new StoreBreaker();
  /** The reservations of this process not settled yet, by tenant: what a refusal waits for. */
  private readonly holding = new Map<string, Set<Reservation>>();
  /** How long a reservation holds, reserve to settle (a moving average); `undefined` before the first. */
  private typicalHoldMs: number | undefined = undefined;

  constructor(
    private readonly store: TokenStore,
    private readonly perMinute: number,
    private readonly reports: BudgetReports,
  ) {
    // Asked once at creation, so that a store that refuses our credentials is told at start.
    this.probe('', Date.now());
  }

  /**
   * Reserves `tokens` (at most the whole budget) for the request when the tenant's use is below
   * its budget: `undefined` when it may go on, else the seconds until the budget allows (for
   * `Retry-After`, an integer ≥ 1).
   */
  reserve(hold: Reservation, tokens: number, now = Date.now()): number | undefined | Promise<number | undefined> {
    if (this.breaker.open) {
      this.reports.storeFailed();
      if (this.breaker.probeDue()) this.probe(hold.tenant, now);
      return undefined;
    }
    const window = windowOf(now);
    const amount = Math.min(Math.max(0, Math.ceil(tokens)), this.perMinute);
    let answer: WindowCounts | undefined | Promise<WindowCounts | undefined>;
    try {
      answer = this.store.take === undefined ? this.readThenAdd(hold.tenant, window, amount, now) : this.store.take(hold.tenant, window, amount, this.perMinute, previousWeight(now));
    } catch (error) {
      this.failed(error);
      return undefined;
    }
    if (!(answer instanceof Promise)) return this.taken(hold, window, amount, answer, now);
    return within(answer).then(
      (read) => this.taken(hold, window, amount, read, now),
      (error: unknown) => {
        this.failed(error);
        return undefined;
      },
    );
  }

  /**
   * The request's answer used `tokens` (0: refund the reservation): the difference from what was
   * reserved is charged or refunded, in the window reserved in while the sliding minute still
   * reads it, the rest in the current one. Once per reservation; failures counted, never thrown.
   */
  settle(hold: Reservation, tokens: number, now = Date.now()): void {
    if (hold.settled) return;
    hold.settled = true;
    const window = windowOf(now);
    const { reserved } = hold;
    if (reserved > 0) this.released(hold, now);
    if (this.breaker.open) return;
    if (reserved === 0) {
      this.add(hold.tenant, window, tokens);
    } else if (hold.window === window) {
      this.add(hold.tenant, window, tokens - reserved);
    } else {
      if (hold.window === window - 1) this.add(hold.tenant, hold.window, -reserved);
      this.add(hold.tenant, window, tokens);
    }
  }

  /** A store without `take`: read, then add when there is room (two calls; see {@link TokenStore.take}). */
  private readThenAdd(tenant: string, window: number, tokens: number, now: number): WindowCounts | undefined | Promise<WindowCounts | undefined> {
    const counts = this.store.read(tenant, window);
    const decide = (read: WindowCounts): WindowCounts | undefined | Promise<undefined> => {
      if (!isCounts(read) || useOf(read, previousWeight(now)) >= this.perMinute) return read;
      const added = this.store.add(tenant, window, tokens);
      return added instanceof Promise ? added.then(() => undefined) : undefined;
    };
    return counts instanceof Promise ? counts.then(decide) : decide(counts);
  }

  /** The store's answer to a reservation: `undefined` (reserved) or counts over the budget, checked to be counts. */
  private taken(hold: Reservation, window: number, amount: number, answer: WindowCounts | undefined, now: number): number | undefined {
    if (answer !== undefined && !isCounts(answer)) {
      this.failed(new Error(`${NOT_A_COUNT} (${JSON.stringify(answer).slice(0, 80)})`));
      return undefined;
    }
    this.recovered();
    if (answer !== undefined) return this.retryAfter(hold.tenant, answer, now);
    // The request ended while the store answered (its client left): nothing will settle this.
    if (hold.settled) {
      this.add(hold.tenant, window, -amount);
      return undefined;
    }
    hold.window = window;
    hold.reserved = amount;
    hold.since = now;
    if (amount > 0) {
      const holds = this.holding.get(hold.tenant);
      if (holds === undefined) this.holding.set(hold.tenant, new Set([hold]));
      else holds.add(hold);
    }
    return undefined;
  }

  /**
   * Seconds until the tenant may go on: when the window's use alone is over the budget, until
   * the sliding minute lets it; when only this process's reservations in flight put it over,
   * until they are expected to have settled (the typical hold after the last began, at least
   * 1 s), which is when their answers' real use replaces them. Reservations held by other
   * replicas sharing the store are not known here: counted as use.
   */
  private retryAfter(tenant: string, counts: WindowCounts, now: number): number {
    const byWindow = retryAfterSeconds(counts, now, this.perMinute);
    const holds = this.holding.get(tenant);
    if (holds === undefined) return byWindow;
    const window = windowOf(now);
    let { current, previous } = counts;
    let lastSince = 0;
    for (const hold of holds) {
      if (hold.window === window) current -= hold.reserved;
      else if (hold.window === window - 1) previous -= hold.reserved;
      else continue;
      if (hold.since > lastSince) lastSince = hold.since;
    }
    if (lastSince === 0 || useOf({ current, previous }, previousWeight(now)) >= this.perMinute) return byWindow;
    const endsMs = lastSince + (this.typicalHoldMs ?? 0) - now;
    return Math.min(byWindow, Math.max(1, Math.ceil(endsMs / 1000)));
  }

  /** A reservation settled: no longer held, and its hold time taken into the typical one. */
  private released(hold: Reservation, now: number): void {
    const holds = this.holding.get(hold.tenant);
    if (holds === undefined || !holds.delete(hold)) return;
    if (holds.size === 0) this.holding.delete(hold.tenant);
    const heldMs = Math.max(0, now - hold.since);
    this.typicalHoldMs = this.typicalHoldMs === undefined ? heldMs : this.typicalHoldMs + (heldMs - this.typicalHoldMs) * HOLD_WEIGHT;
  }

  /** Asks the store for a tenant's counts, with no request waiting: closes the breaker when it answers. */
  private probe(tenant: string, now: number): void {
    let counts: WindowCounts | Promise<WindowCounts>;
    try {
      counts = this.store.read(tenant, windowOf(now));
    } catch (error) {
      this.failed(error);
      return;
    }
    if (!(counts instanceof Promise)) {
      this.recovered();
      return;
    }
    within(counts, PROBE_TIMEOUT_MS).then(
      () => this.recovered(),
      (error: unknown) => this.failed(error),
    );
  }

  private add(tenant: string, window: number, tokens: number): void {
    if (tokens === 0 || !Number.isFinite(tokens)) return;
    try {
      const done = this.store.add(tenant, window, tokens);
      if (done instanceof Promise) within(done).then(() => this.recovered(), (error: unknown) => this.failed(error));
    } catch (error) {
      this.failed(error);
    }
  }

  private failed(error: unknown): void {
    this.reports.storeFailed();
    const why = error instanceof Error ? error.message : String(error);
    // A tenant's count that is not a number is that tenant's problem, not the store's: the
    // store answered, and other tenants' budgets still count.
    if (!why.includes(NOT_A_COUNT)) this.breaker.failed();
    const refused = REFUSED_CREDENTIALS.test(why);
    if (this.down) return;
    this.down = true;
    const message = `express-dp-router: the ${this.store.kind} token store failed (${why}); token budgets are not enforced until it answers again.`;
    if (refused) this.reports.error(`${message} It refuses the credentials it was given: check the password (or ACL user) of the client passed to the store.`);
    else this.reports.warn(message);
  }

  private recovered(): void {
    this.breaker.succeeded();
    if (!this.down) return;
    this.down = false;
    this.reports.warn(`express-dp-router: the ${this.store.kind} token store answers again; token budgets are enforced.`);
  }
}

function within<T>(pending: Promise<T>, timeoutMs = STORE_TIMEOUT_MS): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs).unref();
    pending.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}
