/**
 * Requests of one upstream whose new blocks have not yet appeared in any rank's events when
 * their answer ended, by the router key of the prompt's last block. Bounded: past `max` the
 * oldest is given up; each is awaited until its due time. Entries are added in time order, so
 * the oldest are always at the head of the ring and a sweep stops at the first that is not due.
 */

/** What is awaited: a key, and the rank it should appear on. */
export interface Awaited {
  readonly key: number;
  readonly rank: number;
}

class Entry<T extends Awaited> {
  /** The next entry awaiting the same key (two requests with one prompt, say). */
  next: Entry<T> | undefined = undefined;
  settled = false;
  constructor(
    readonly item: T,
    readonly due: number,
  ) {}
}

export class PendingKeys<T extends Awaited> {
  private readonly ring: Array<Entry<T> | undefined>;
  private head = 0;
  private count = 0;
  /** Key → the oldest unsettled entry awaiting it. */
  private readonly byKey = new Map<number, Entry<T>>();

  constructor(private readonly max: number) {
    this.ring = new Array(max).fill(undefined);
  }

  /** Whether nothing is awaited (the events' apply path asks this of every stored block). */
  get empty(): boolean {
    return this.byKey.size === 0;
  }

  /** Awaits `item` until `due`; when full, the oldest is given up first (to `expired`). */
  add(item: T, due: number, expired: (item: T) => void): void {
    if (this.count === this.max) this.shift(expired);
    const entry = new Entry(item, due);
    this.ring[(this.head + this.count) % this.max] = entry;
    this.count++;
    const first = this.byKey.get(item.key);
    if (first === undefined) {
      this.byKey.set(item.key, entry);
      return;
    }
    let last = first;
    while (last.next !== undefined) last = last.next;
    last.next = entry;
  }

  /**
   * `rank` stored `key`: the entry awaiting it there, or else the oldest awaiting it anywhere,
   * taken out; `undefined` when none awaits the key.
   */
  take(key: number, rank: number): T | undefined {
    const first = this.byKey.get(key);
    if (first === undefined) return undefined;
    let before: Entry<T> | undefined;
    let found = first;
    for (let at: Entry<T> | undefined = first, previous: Entry<T> | undefined; at !== undefined; previous = at, at = at.next) {
      if (at.item.rank === rank) {
        found = at;
        before = previous;
        break;
      }
    }
    this.unlink(found, before);
    return found.item;
  }

  /** Gives up every entry due by `now`, oldest first. */
  sweep(now: number, expired: (item: T) => void): void {
    while (this.count > 0 && this.ring[this.head]!.due <= now) this.shift(expired);
  }

  /** Forgets everything, telling nothing. */
  clear(): void {
    this.ring.fill(undefined);
    this.head = 0;
    this.count = 0;
    this.byKey.clear();
  }

  /** Takes the oldest entry out of the ring; one still awaited is given up. */
  private shift(expired: (item: T) => void): void {
    const entry = this.ring[this.head]!;
    this.ring[this.head] = undefined;
    this.head = (this.head + 1) % this.max;
    this.count--;
    if (entry.settled) return;
    let before: Entry<T> | undefined;
    for (let at = this.byKey.get(entry.item.key); at !== undefined && at !== entry; at = at.next) before = at;
    this.unlink(entry, before);
    expired(entry.item);
  }

  private unlink(entry: Entry<T>, before: Entry<T> | undefined): void {
    entry.settled = true;
    if (before !== undefined) before.next = entry.next;
    else if (entry.next !== undefined) this.byKey.set(entry.item.key, entry.next);
    else this.byKey.delete(entry.item.key);
    entry.next = undefined;
  }
}
