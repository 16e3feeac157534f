import type { RouterLogger } from '../observe/logger';

/**
 * The log's word on disaggregated requests served decode-only (`onPrefillFailure:
 * 'decode-only'`), which would otherwise show only in
 * `dp_router_disaggregated_requests_total{outcome="decode_only"}`: a notice the first time each
 * cause sends a request decode-only, and one line at info when a prefill leg succeeds again, as
 * health check transitions are told.
 */
export class FallbackLog {
  private readonly told = new Set<string>();
  /** Requests served decode-only since the last prefill leg that succeeded. */
  private served = 0;

  constructor(private readonly logger: RouterLogger) {}

  /** A request goes decode-only: its prefill leg failed for `cause`, as `why` says (at `upstream`, when one was tried). */
  fellBack(cause: string, why: string, upstream: string | undefined): void {
    this.served++;
    if (this.told.has(cause)) return;
    this.told.add(cause);
    const where = upstream === undefined ? why : `upstream '${upstream}': ${why}`;
    this.logger.decodeOnly(`express-dp-router: prefill leg failed (${where}): requests are served decode-only (onPrefillFailure: 'decode-only') until a prefill leg succeeds`, true);
  }

  /** A prefill leg succeeded. */
  succeeded(): void {
    if (this.served === 0) return;
    const served = this.served;
    this.served = 0;
    this.told.clear();
    this.logger.decodeOnly(`express-dp-router: prefill legs succeed again; ${served} request${served === 1 ? ' was' : 's were'} served decode-only meanwhile`, false, { decodeOnly: served });
  }
}
