/**
 * The tokenizer's cache of pieces of text (between added tokens, or between text cuts) and
 * their token ids: LRU, bounded by what it really holds in bytes.
 */

// A cached piece costs its text (2 bytes a UTF-16 unit), its ids (8 bytes each in a packed
// array) and a map entry.
const ENTRY_OVERHEAD_BYTES = 80;

interface CachedPiece {
  /** The map's key, a string of its own (never a slice of a request's text). */
  readonly key: string;
  readonly ids: number[];
}

/** Pieces of text and their ids, least recently used evicted first past `maxBytes`. */
export class PieceCache {
  private readonly map = new Map<string, CachedPiece>();
  private held = 0;

  constructor(private readonly maxBytes: number) {}

  /** Bytes held (texts, ids, entries). */
  get heldBytes(): number {
    return this.held;
  }

  /** The ids of `key`, marked as used; the array is the cache's own (not to be changed). */
  get(key: string): number[] | undefined {
    const cached = this.map.get(key);
    if (cached === undefined) return undefined;
    // Re-inserted under the entry's own key: `key` may be a slice of a long request.
    this.map.delete(cached.key);
    this.map.set(cached.key, cached);
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
    this.map.set(own, { key: own, ids });
    this.held += bytes;
    for (const [old, entry] of this.map) {
      if (this.held <= this.maxBytes) return;
      this.map.delete(old);
      this.held -= pieceBytes(old, entry.ids);
    }
  }

  clear(): void {
    this.map.clear();
    this.held = 0;
  }
}

function pieceBytes(key: string, ids: readonly number[]): number {
  return key.length * 2 + ids.length * 8 + ENTRY_OVERHEAD_BYTES;
}

/** A flat copy of `text` that shares no storage with it (a JSON round trip is exact, lone surrogates included). */
export function ownString(text: string): string {
  return JSON.parse(JSON.stringify(text)) as string;
}
