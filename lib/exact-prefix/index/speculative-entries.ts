/**
 * One rank's speculative entries: router key → when it stops counting, dropped oldest first.
 *
 * Every routed request holds its prompt's blocks again, most of them held already by the
 * request before. A Map kept in expiry order by deleting and re-inserting each key cost two
 * lookups, a deletion and the rehashing its holes brought per block; here a key held already
 * costs one lookup and two field writes. The order lives in a list of entries with their place
 * in it: a key held again takes a new place, and the old one is passed over as stale.
 */

class Speculative {
  constructor(
    readonly key: number,
    public expiresAt: number,
    /** Where its live place in `order` is; −1 once it is no longer held. */
    public at: number,
  ) {}
}

/** Speculative entries in the order they were last held (every entry has the same lifetime, so in expiry order). */
export class SpeculativeEntries {
  private readonly entries = new Map<number, Speculative>();
  /** Entries by when they were last held; a place whose entry moved on (`entry.at` differs) is stale. */
  private order: Speculative[] = [];
  /** Places before it are passed (stale or dropped). */
  private head = 0;

  /** Entries held, expired ones included until dropped. */
  get size(): number {
    return this.entries.size;
  }

  /** When `key` stops counting, or `undefined` when it is not held. */
  expiryOf(key: number): number | undefined {
    return this.entries.get(key)?.expiresAt;
  }

  /** Holds `key` until `expiresAt`, as the newest entry; true when it was not held before. */
  hold(key: number, expiresAt: number): boolean {
    const order = this.order;
    const entry = this.entries.get(key);
    if (entry === undefined) {
      const fresh = new Speculative(key, expiresAt, order.length);
      this.entries.set(key, fresh);
      order.push(fresh);
    } else {
      entry.expiresAt = expiresAt;
      entry.at = order.length;
      order.push(entry);
    }
    while (this.head < order.length && order[this.head].at !== this.head) this.head++;
    // Stale places cost memory only; at more of them than of entries the list is rebuilt, an
    // amortized field write per hold.
    if (order.length - this.entries.size > this.entries.size + 1024) this.compact();
    return entry === undefined;
  }

  /** Forgets `key`; false when it was not held. */
  delete(key: number): boolean {
    const entry = this.entries.get(key);
    if (entry === undefined) return false;
    this.entries.delete(key);
    entry.at = -1;
    return true;
  }

  /** Drops entries from the oldest on while they expire at or before `now`; how many were dropped. */
  dropExpired(now: number): number {
    const order = this.order;
    let dropped = 0;
    for (; this.head < order.length; this.head++) {
      const entry = order[this.head];
      if (entry.at !== this.head) continue;
      if (entry.expiresAt > now) break;
      this.entries.delete(entry.key);
      entry.at = -1;
      dropped++;
    }
    return dropped;
  }

  /** Drops the oldest entry; false when none is held. */
  dropOldest(): boolean {
    const order = this.order;
    for (; this.head < order.length; this.head++) {
      const entry = order[this.head];
      if (entry.at !== this.head) continue;
      this.entries.delete(entry.key);
      entry.at = -1;
      this.head++;
      return true;
    }
    return false;
  }

  clear(): void {
    this.entries.clear();
    this.order = [];
    this.head = 0;
  }

  private compact(): void {
    const live: Speculative[] = [];
    const order = this.order;
    for (let at = this.head; at < order.length; at++) {
      const entry = order[at];
      if (entry.at !== at) continue;
      entry.at = live.length;
      live.push(entry);
    }
    this.order = live;
    this.head = 0;
  }
}
