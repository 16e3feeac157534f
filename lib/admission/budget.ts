import { retryAfterSeconds, usedAt, windowOf, type TokenStore, type WindowCounts } from './token-window';

/** How long a store may take before the request goes on without it (fail open). */
const STORE_TIMEOUT_MS = 250;

/** What the budget reports to: the error counter and the log. */
export interface BudgetReports {
  storeFailed(): void;
  warn(message: string): void;
}

/**
 * A per-tenant token budget over a store. A store that fails or is slow never stops traffic:
 * the request is let through (fail open), each failure counted, and the outage logged once,
 * with one more line when the store answers again.
 */
export class TokenBudget {
  private down = false;

  constructor(
    private readonly store: TokenStore,
    private readonly perMinute: number,
    private readonly reports: BudgetReports,
  ) {}

  /** `undefined` when the tenant may go on, else the seconds until its budget allows (for `Retry-After`). */
  check(tenant: string, now = Date.now()): number | undefined | Promise<number | undefined> {
    let counts: WindowCounts | Promise<WindowCounts>;
    try {
      counts = this.store.read(tenant, windowOf(now));
    } catch (error) {
      this.failed(error);
      return undefined;
    }
    if (!(counts instanceof Promise)) return this.verdict(counts, now);
    return within(counts).then(
      (read) => {
        this.recovered();
        return this.verdict(read, now);
      },
      (error: unknown) => {
        this.failed(error);
        return undefined;
      },
    );
  }

  /** Counts `tokens` the tenant used; a failure is counted and logged, never thrown. */
  add(tenant: string, tokens: number, now = Date.now()): void {
    if (!(tokens > 0)) return;
    try {
      const done = this.store.add(tenant, windowOf(now), tokens);
      if (done instanceof Promise) within(done).then(() => this.recovered(), (error: unknown) => this.failed(error));
    } catch (error) {
      this.failed(error);
    }
  }

  private verdict(counts: WindowCounts, now: number): number | undefined {
    return usedAt(counts, now) < this.perMinute ? undefined : retryAfterSeconds(counts, now, this.perMinute);
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
