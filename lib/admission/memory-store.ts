import { useOf, type TokenStore, type WindowCounts } from './token-window';

/** A tenant's two windows, in this process. */
interface Entry {
  window: number;
  current: number;
  previous: number;
}

/** Tenants kept at most; past it the least recently counted goes (its budget starts afresh). */
const MAX_TENANTS = 100_000;

/**
 * The default token store: this process's counts, one small entry per tenant seen in the last
 * two minutes. Memory is bounded: entries too old to count are swept as new ones come, and the
 * map never holds more than {@link MAX_TENANTS}. Its `take` is atomic: JavaScript runs it in one go.
 */
export function createMemoryTokenStore(maxTenants = MAX_TENANTS): TokenStore {
  // Insertion order is the order of last use (an entry is re-inserted when counted).
  const entries = new Map<string, Entry>();
  const countsOf = (entry: Entry | undefined, window: number): WindowCounts => {
    if (entry === undefined || entry.window < window - 1) return ZERO;
    if (entry.window === window) return { current: entry.current, previous: entry.previous };
    if (entry.window === window - 1) return { current: 0, previous: entry.current };
    // A window before the entry's: `window` is behind the clock of a later call.
    return entry.window === window + 1 ? { current: entry.previous, previous: 0 } : ZERO;
  };
  const add = (tenant: string, window: number, tokens: number) => {
    let entry = entries.get(tenant);
    if (entry === undefined) {
      // A refund for a tenant swept meanwhile: its charge went with it.
      if (tokens <= 0) return;
      entry = { window, current: 0, previous: 0 };
    } else {
      entries.delete(tenant);
    }
    if (window > entry.window) {
      entry.previous = window === entry.window + 1 ? entry.current : 0;
      entry.current = 0;
      entry.window = window;
    }
    if (window === entry.window) entry.current += tokens;
    else if (window === entry.window - 1) entry.previous += tokens;
    entries.set(tenant, entry);
    // The oldest entries first: stop at the first still in use.
    for (const [key, oldest] of entries) {
      if (entries.size <= maxTenants && oldest.window >= entry.window - 1) break;
      entries.delete(key);
    }
  };
  return {
    kind: 'memory',
    read: (tenant, window) => countsOf(entries.get(tenant), window),
    add,
    take(tenant, window, tokens, limit, previousWeight) {
      const entry = entries.get(tenant);
      // An entry of this window is read in place; a copy is made only for a refusal's `Retry-After`.
      const counts = entry !== undefined && entry.window === window ? entry : countsOf(entry, window);
      if (useOf(counts, previousWeight) >= limit) return { current: counts.current, previous: counts.previous };
      add(tenant, window, tokens);
      return undefined;
    },
  };
}

const ZERO: WindowCounts = Object.freeze({ current: 0, previous: 0 });
