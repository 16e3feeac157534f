import { hashString, keyedMix32, randomKey32 } from '../hash';

/**
 * Writes the chained content hashes of the prompt's first `count` blocks into `out`: block
 * `i`'s hash covers all text before its end, as vLLM's block hashes do. Deterministic, the same
 * in every process. Returns `count`.
 */
export function hashPromptBlocks(prompt: string, blockChars: number, count: number, out: Int32Array): number {
  let hash = 0;
  for (let i = 0; i < count; i++) {
    hash = hashString(prompt, hash, i * blockChars, (i + 1) * blockChars);
    out[i] = hash;
  }
  return count;
}

/**
 * The block hashes one endpoint was sent, approximately least-recently-used: two
 * generations of at most `maxBlocks` hashes each; when the current one fills, the older is
 * dropped whole. So the `maxBlocks` most recently used hashes are always held (the rank's
 * cache, sized alike, forgets nothing the index still needs), and at most `2 × maxBlocks`.
 * Each generation is an open-addressing hash set in an `Int32Array` at most half full, so a
 * touch is a probe or two with no allocation, and the memory is fixed:
 * `16 × nextPowerOfTwo(maxBlocks)` bytes (512 KiB for the default `maxBlocksPerEndpoint`).
 */
export class BlockIndex {
  /** New blocks recorded lately (halved as the policy's total passes its bound). */
  recentBlocks = 0;
  private current: HashSet32;
  private previous: HashSet32;
  private readonly generationSize: number;
  private readonly slotKey: number;
  /** Both tables have the same size and key, so a hash's home slot is computed once for both. */
  private readonly mask: number;

  /** `slotKey` keys the tables' slot hash; a random one (the default) keeps clients from forging collisions. */
  constructor(maxBlocks: number, slotKey = randomKey32()) {
    this.generationSize = maxBlocks;
    this.slotKey = slotKey;
    this.current = new HashSet32(this.generationSize);
    this.previous = new HashSet32(this.generationSize);
    this.mask = this.current.mask;
  }

  /** Slot probes past the first, over the index's life: the work hash collisions cost. */
  get extraProbes(): number {
    return this.current.extraProbes + this.previous.extraProbes;
  }

  /** How many block hashes are held (never more than `2 × maxBlocks`). */
  get size(): number {
    return this.current.size + this.previous.size;
  }

  /** Bytes held by the index's tables. */
  get bytes(): number {
    return this.current.bytes + this.previous.bytes;
  }

  has(hash: number): boolean {
    const key = hash === 0 ? 1 : hash;
    const home = keyedMix32(key, this.slotKey) & this.mask;
    return this.current.has(key, home) || this.previous.has(key, home);
  }

  /**
   * The number of leading blocks held. Blocks are recorded last-to-first, so a block is
   * never older than the blocks before it in its chain: the held blocks of a chain form a
   * prefix, and a binary search finds its end. Returns 0 early when it cannot reach `toBeat`.
   */
  leadingRun(hashes: Int32Array, count: number, toBeat: number): number {
    if (!this.has(hashes[0])) return 0;
    let low = 1;
    if (toBeat > 1) {
      if (!this.has(hashes[toBeat - 1])) return 0;
      low = toBeat;
    }
    let high = count;
    while (low < high) {
      const middle = (low + high + 1) >>> 1;
      if (this.has(hashes[middle - 1])) low = middle;
      else high = middle - 1;
    }
    return low;
  }

  /**
   * Marks the blocks as just used, last to first so that a prompt's head outlives its tail.
   * Returns how many were not held before.
   */
  record(hashes: Int32Array, count: number): number {
    let added = 0;
    for (let i = count - 1; i >= 0; i--) {
      const hash = hashes[i];
      const key = hash === 0 ? 1 : hash;
      const home = keyedMix32(key, this.slotKey) & this.mask;
      if (!this.current.add(key, home)) continue;
      // Only for a hash new to the current generation (adding to one leaves the other as it was).
      if (!this.previous.has(key, home)) added++;
      if (this.current.size >= this.generationSize) {
        const dropped = this.previous;
        this.previous = this.current;
        dropped.clear();
        this.current = dropped;
      }
    }
    return added;
  }
}

/**
 * Slots a lookup or insertion probes at most. At the tables' load of at most one half, the
 * longest run of occupied slots in a table of 2^16 slots is about 50 with a random slot hash,
 * so the bound almost never turns a hash away, and it caps the work of any one operation
 * whatever the hashes are.
 */
export const MAX_PROBES = 64;

/**
 * A fixed-capacity set of 32-bit keys (a hash, 0 written as 1) with linear probing from a home
 * slot its owner computes with a keyed slot hash; 0 marks an empty slot. A hash is never stored more than `MAX_PROBES − 1` slots past its home slot
 * (an insertion that would go further is dropped: the index forgets that block), so a lookup
 * that has probed `MAX_PROBES` slots knows the hash is absent.
 */
class HashSet32 {
  size = 0;
  /** Probes past the first slot, ever (not reset by `clear`). */
  extraProbes = 0;
  private readonly slots: Int32Array;
  readonly mask: number;

  constructor(maxEntries: number) {
    let capacity = 2;
    while (capacity < maxEntries * 2) capacity *= 2;
    this.slots = new Int32Array(capacity);
    this.mask = capacity - 1;
  }

  get bytes(): number {
    return this.slots.byteLength;
  }

  has(key: number, home: number): boolean {
    const slot = this.slotOf(key, home);
    return slot >= 0 && this.slots[slot] === key;
  }

  /**
   * Adds the hash; returns whether it was added (false when held, or when its probe run is
   * full). The owner keeps `size` at most half the slots.
   */
  add(key: number, home: number): boolean {
    const slot = this.slotOf(key, home);
    if (slot < 0 || this.slots[slot] === key) return false;
    this.slots[slot] = key;
    this.size++;
    return true;
  }

  /**
   * Linear probing: the slot holding `key`, or the empty slot where it would go; -1 when
   * `MAX_PROBES` slots hold neither.
   */
  private slotOf(key: number, home: number): number {
    const slots = this.slots;
    let slot = home;
    let probed = 1;
    while (slots[slot] !== key && slots[slot] !== 0) {
      if (probed === MAX_PROBES) return -1;
      probed++;
      this.extraProbes++;
      slot = (slot + 1) & this.mask;
    }
    return slot;
  }

  clear(): void {
    this.slots.fill(0);
    this.size = 0;
  }
}
