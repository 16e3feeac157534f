/**
 * The token store's circuit breaker. A store that is down would cost every request its whole
 * timeout (250 ms of time to first token, for every tenant, for the whole outage); after
 * {@link FAILURES_TO_OPEN} failures in a row the budget stops asking it (fail open at once),
 * and asks again only through a probe, at most one every {@link PROBE_EVERY_MS}, that no
 * request waits for.
 */

/** Failures in a row (timeouts, refused connections, refused credentials) that open the breaker. */
export const FAILURES_TO_OPEN = 2;
/** How long an open breaker waits between probes. */
export const PROBE_EVERY_MS = 1_000;

export class StoreBreaker {
  private failures = 0;
  /** While open: when the next probe may go (`performance.now()` ms); 0 when closed. */
  private probeAt = 0;
  private probing = false;

  /** Whether the store is not to be asked now (the request goes on unchecked). */
  get open(): boolean {
    return this.probeAt !== 0;
  }

  /** Whether an open breaker's probe is due: true once per {@link PROBE_EVERY_MS}, then false until it ends. */
  probeDue(now = performance.now()): boolean {
    if (this.probeAt === 0 || this.probing || now < this.probeAt) return false;
    this.probing = true;
    return true;
  }

  /** The store answered (a call or a probe): the breaker closes. */
  succeeded(): void {
    this.failures = 0;
    this.probeAt = 0;
    this.probing = false;
  }

  /** A call or a probe failed; the breaker opens at the {@link FAILURES_TO_OPEN}th in a row, and a failed probe waits for the next. */
  failed(now = performance.now()): void {
    this.probing = false;
    this.failures++;
    if (this.failures >= FAILURES_TO_OPEN) this.probeAt = now + PROBE_EVERY_MS;
  }
}
