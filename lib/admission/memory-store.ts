import type { TokenStore, WindowCounts } from './token-window';

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
 * map never holds more than {@link MAX_TENANTS}.
 */
export function createMemoryTokenStore(maxTenants = MAX_TENANTS): TokenStore {
  // Insertion order is the order of last use (an entry is re-inserted when counted).
  const entries = new Map<string, Entry>();
  const countsOf = (entry: Entry | undefined, window: number): WindowCounts => {
    if (entry === undefined || entry.window < window - 1) return ZERO;
    if (entry.window === window) return entry;
    return { current: 0, previous: entry.current };
  };
  return {
    kind: 'memory',
    read: (tenant, window) => countsOf(entries.get(tenant), window),
    add(tenant, window, tokens) {
      const entry = entries.get(tenant);
      const { current, previous } = countsOf(entry, window);
      if (entry !== undefined) entries.delete(tenant);
      entries.set(tenant, { window, current: current + tokens, previous });
      // The oldest entries first: stop at the first still in use.
      for (const [key, oldest] of entries) {
        if (entries.size <= maxTenants && oldest.window >= window - 1) break;
        entries.delete(key);
      }
    },
  };
}

const ZERO: WindowCounts = { current: 0, previous: 0 };
