/**
 * The tokenizer's cache of pieces of text (between added tokens, or between text cuts) and
 * their token ids, bounded by what it really holds in bytes. Eviction is CLOCK (second chance):
 * a hit sets a bit and moves nothing, and one hand goes round the map. An LRU kept by deleting
 * and re-inserting every hit left a hole per hit at the map's head that each eviction scan
 * walked again: at 24,000 entries a request of 33 hits cost 3.9 ms, growing with the cache.
 */

// A cached piece costs its text (2 bytes a UTF-16 unit), its ids (8 bytes each in a packed
// array) and a map entry.
const ENTRY_OVERHEAD_BYTES = 80;

interface CachedPiece {
  /** The map's key, a string of its own (never a slice of a request's text). */
  readonly key: string;
  readonly ids: number[];
  readonly bytes: number;
  /** Hit since the hand last passed. */
  used: boolean;
}

/** Pieces of text and their ids; past `maxBytes`, the first the hand finds unused since it last passed goes. */
export class PieceCache {
  private readonly map = new Map<string, CachedPiece>();
  private held = 0;
  /** The CLOCK hand: a live iterator, so deletions and insertions behind it cost it nothing. */
  private hand: Iterator<CachedPiece> | undefined;

  constructor(private readonly maxBytes: number) {}

  /** Bytes held (texts, ids, entries). */
  get heldBytes(): number {
    return this.held;
  }

  /** The ids of `key`, marked as used; the array is the cache's own (not to be changed). */
  get(key: string): number[] | undefined {
    const cached = this.map.get(key);
    if (cached === undefined) return undefined;
    cached.used = true;
    return cached.ids;
  }

  /** Keeps `ids` for `key` unless the one entry would take more than a quarter of the cache. */
  set(key: string, ids: number[]): void {
    const bytes = pieceBytes(key, ids);
    if (bytes > this.maxBytes / 4) return;
    // A copy: a slice() would keep the whole rendered prompt it came from alive (V8's sliced
    // strings point into their parent), so 60 requests of a short new piece before 2 MB of
    // text held 118 MiB while the cache counted 27 KB.
    const own = ownString(key);
    const old = this.map.get(own);
    if (old !== undefined) this.held -= old.bytes;
    this.map.set(own, { key: own, ids, bytes, used: false });
    this.held += bytes;
    while (this.held > this.maxBytes) this.evictOne();
  }

  clear(): void {
    this.map.clear();
    this.held = 0;
    this.hand = undefined;
  }

  private evictOne(): void {
    let next = this.hand?.next();
    if (next === undefined || next.done === true) {
      // Round again from the start (holes left behind are compacted by the map's own rehashing).
      this.hand = this.map.values();
      next = this.hand.next();
      if (next.done === true) return;
    }
    const entry = next.value;
    if (entry.used) {
      entry.used = false;
      return;
    }
    this.map.delete(entry.key);
    this.held -= entry.bytes;
  }
}

function pieceBytes(key: string, ids: readonly number[]): number {
  return key.length * 2 + ids.length * 8 + ENTRY_OVERHEAD_BYTES;
}

/** A flat copy of `text` that shares no storage with it (a JSON round trip is exact, lone surrogates included). */
export function ownString(text: string): string {
  return JSON.parse(JSON.stringify(text)) as string;
}
