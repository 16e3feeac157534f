/**
 * The token budget's arithmetic: a sliding minute approximated by two fixed ones (the current
 * and the previous, weighted by how much of it the sliding minute still covers), as Cloudflare
 * and rate-limit stores do. Two counters per tenant, whatever the traffic.
 */

/** The fixed window's length. */
export const WINDOW_MS = 60_000;

/** A tenant's tokens in the current fixed window and the one before. */
export interface WindowCounts {
  readonly current: number;
  readonly previous: number;
}

/** Where a token budget is kept. The router calls it per request; `redisTokenStore` shares it across replicas. */
export interface TokenStore {
  /** `'memory'` or `'redis'`: for logs. */
  readonly kind: string;
  /** The tenant's counts in fixed window `window` (`floor(ms / WINDOW_MS)`) and the one before. */
  read(tenant: string, window: number): WindowCounts | Promise<WindowCounts>;
  /** Adds `tokens` to the tenant's count in `window` (the current one or the one before); negative: a refund. */
  add(tenant: string, window: number, tokens: number): void | Promise<void>;
  /**
   * Optional, and atomic where several gateways share the store: when the tenant's use
   * (`previous × previousWeight + current`) is below `limit`, adds `tokens` to `current` and
   * returns `undefined`; otherwise adds nothing and returns the counts it read. Without it the
   * router reads, then adds: concurrent requests through other gateways may all see room.
   */
  take?(tenant: string, window: number, tokens: number, limit: number, previousWeight: number): WindowCounts | undefined | Promise<WindowCounts | undefined>;
}

/**
 * What a store's error says when a tenant's count is not a number (another writer on a shared
 * Redis): that tenant's failure, not the store's, so it does not open the breaker.
 */
export const NOT_A_COUNT = 'a token count is not an integer';

/** Whether `value` has a store's shape. */
export function isTokenStore(value: unknown): value is TokenStore {
  const store = value as Partial<TokenStore> | null;
  return typeof store === 'object' && store !== null && typeof store.read === 'function' && typeof store.add === 'function' && (store.take === undefined || typeof store.take === 'function');
}

/** Whether a store's answer is a count: a finite number (another writer on a shared Redis may have left anything). */
export function isCounts(counts: unknown): counts is WindowCounts {
  const read = counts as Partial<WindowCounts> | null;
  return typeof read === 'object' && read !== null && Number.isFinite(read.current) && Number.isFinite(read.previous);
}

/** The fixed window `now` falls in. */
export function windowOf(now: number): number {
  return Math.floor(now / WINDOW_MS);
}

/** How much of the previous window the sliding minute ending at `now` still covers (1 at a window's start, towards 0 at its end). */
export function previousWeight(now: number): number {
  return 1 - (now % WINDOW_MS) / WINDOW_MS;
}

/** Tokens used in the sliding minute ending at `now`. */
export function usedAt(counts: WindowCounts, now: number): number {
  return useOf(counts, previousWeight(now));
}

/** Tokens used, the previous window weighted by `weight`; a negative count (a refund whose charge was lost) counts as none. */
export function useOf(counts: WindowCounts, weight: number): number {
  return Math.max(0, counts.previous) * weight + Math.max(0, counts.current);
}

/**
 * Whole seconds (≥ 1) until the sliding minute's use drops below `limit`, with no more use:
 * the previous window's share shrinks as time passes, and past the current window's end the
 * current count becomes the previous one.
 */
export function retryAfterSeconds(counts: WindowCounts, now: number, limit: number): number {
  const into = now % WINDOW_MS;
  const current = Math.max(0, counts.current);
  const previous = Math.max(0, counts.previous);
  let waitMs: number;
  if (current < limit) {
    // previous × (1 − t/W) + current < limit  ⇔  t > W × (1 − (limit − current) / previous)
    const t = previous > 0 ? WINDOW_MS * (1 - (limit - current) / previous) : 0;
    waitMs = t - into;
  } else {
    waitMs = WINDOW_MS - into + WINDOW_MS * (1 - limit / current);
  }
  // Counts are checked finite before this; the fallback keeps `Retry-After` an integer whatever comes.
  return Number.isFinite(waitMs) ? Math.max(1, Math.ceil(waitMs / 1000)) : (2 * WINDOW_MS) / 1000;
}
