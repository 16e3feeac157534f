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
  /** Adds `tokens` to the tenant's count in `window`. */
  add(tenant: string, window: number, tokens: number): void | Promise<void>;
}

/** Whether `value` has a store's shape. */
export function isTokenStore(value: unknown): value is TokenStore {
  const store = value as Partial<TokenStore> | null;
  return typeof store === 'object' && store !== null && typeof store.read === 'function' && typeof store.add === 'function';
}

/** The fixed window `now` falls in. */
export function windowOf(now: number): number {
  return Math.floor(now / WINDOW_MS);
}

/** Tokens used in the sliding minute ending at `now`. */
export function usedAt(counts: WindowCounts, now: number): number {
  const elapsed = (now % WINDOW_MS) / WINDOW_MS;
  return counts.previous * (1 - elapsed) + counts.current;
}

/**
 * Whole seconds (≥ 1) until the sliding minute's use drops below `limit`, with no more use:
 * the previous window's share shrinks as time passes, and past the current window's end the
 * current count becomes the previous one.
 */
export function retryAfterSeconds(counts: WindowCounts, now: number, limit: number): number {
  const into = now % WINDOW_MS;
  const { current, previous } = counts;
  let waitMs: number;
  if (current < limit) {
    // previous × (1 − t/W) + current < limit  ⇔  t > W × (1 − (limit − current) / previous)
    const t = previous > 0 ? WINDOW_MS * (1 - (limit - current) / previous) : 0;
    waitMs = t - into;
  } else {
    waitMs = WINDOW_MS - into + WINDOW_MS * (1 - limit / current);
  }
  return Math.max(1, Math.ceil(waitMs / 1000));
}
