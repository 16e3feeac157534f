import { isCounts, previousWeight, retryAfterSeconds, useOf, windowOf, type TokenStore, type WindowCounts } from './token-window';

/** How long a store may take before the request goes on without it (fail open). */
const STORE_TIMEOUT_MS = 250;

/** What the budget reports to: the error counter and the log. */
export interface BudgetReports {
  storeFailed(): void;
  warn(message: string): void;
}

/** One request's hold on its tenant's budget, from its reservation to its settlement. */
export interface Reservation {
  readonly tenant: string;
  /** The fixed window the reservation was counted in. */
  window: number;
  /** Tokens reserved (0: none, the store failed or it was not reserved yet). */
  reserved: number;
  /** Whether the answer's tokens were counted (or the reservation refunded): once only. */
  settled: boolean;
}

/**
 * A per-tenant token budget over a store. A request reserves its estimate when it is admitted,
 * so that concurrent requests see each other, and settles to what its answer used when that
 * ends. A store that fails, is slow or answers something other than a count never stops
 * traffic: the request is let through (fail open), each failure counted, and the outage logged
 * once, with one more line when the store answers again.
 */
export class TokenBudget {
  private down = false;

  constructor(
    private readonly store: TokenStore,
    private readonly perMinute: number,
    private readonly reports: BudgetReports,
  ) {}

  /**
   * Reserves `tokens` (at most the whole budget) for the request when the tenant's use is below
   * its budget: `undefined` when it may go on, else the seconds until the budget allows (for
   * `Retry-After`, an integer ≥ 1).
   */
  reserve(hold: Reservation, tokens: number, now = Date.now()): number | undefined | Promise<number | undefined> {
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
      this.failed(new Error(`it answered a count that is not a number (${JSON.stringify(answer).slice(0, 80)})`));
      return undefined;
    }
    this.recovered();
    if (answer !== undefined) return retryAfterSeconds(answer, now, this.perMinute);
    // The request ended while the store answered (its client left): nothing will settle this.
    if (hold.settled) this.add(hold.tenant, window, -amount);
    hold.window = window;
    hold.reserved = amount;
    return undefined;
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
    if (this.down) return;
    this.down = true;
    const why = error instanceof Error ? error.message : String(error);
    this.reports.warn(`express-dp-router: the ${this.store.kind} token store failed (${why}); token budgets are not enforced until it answers again.`);
  }

  private recovered(): void {
    if (!this.down) return;
    this.down = false;
    this.reports.warn(`express-dp-router: the ${this.store.kind} token store answers again; token budgets are enforced.`);
  }
}

function within<T>(pending: Promise<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no answer within ${STORE_TIMEOUT_MS} ms`)), STORE_TIMEOUT_MS);
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
