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

/** A hash's home slot in a table keyed by `slotKey` with `mask` (0 is stored as 1). */
function homeSlot(hash: number, slotKey: number, mask: number): number {
  return keyedMix32(hash === 0 ? 1 : hash, slotKey) & mask;
}

/**
 * Writes the home slots of the first `count` hashes into `out` (returned): the same in every
 * {@link BlockIndex} with this `slotKey` and `mask`, so a policy whose indexes share a key
 * computes them once per prompt instead of once per candidate and probe.
 */
export function blockHomes(hashes: Int32Array, count: number, slotKey: number, mask: number, out: Int32Array): Int32Array {
  for (let i = 0; i < count; i++) out[i] = homeSlot(hashes[i], slotKey, mask);
  return out;
}

/**
 * The block hashes one endpoint was sent, approximately least-recently-used: two
 * generations of at most `maxBlocks` hashes each; when the current one fills, the older is
 * dropped whole. So the `maxBlocks` most recently used hashes are always held (the rank's
 * cache, sized alike, forgets nothing the index still needs), and at most `2 × maxBlocks`.
 * Each generation is an open-addressing hash set at most half full, so a touch is a probe or
 * two with no allocation, and the memory is fixed: `16 × nextPowerOfTwo(maxBlocks)` bytes
 * (512 KiB for the default `maxBlocksPerEndpoint`).
 *
 * The two generations share one `Int32Array`, slot by slot (generation `g`'s slot `s` at
 * `2s + g`), and a hash's home slot is the same in both: a lookup that misses the current
 * generation finds the previous one's slot in the same cache line. Tables of many endpoints
 * do not fit a CPU cache, so a pick's cost is mostly these memory reads.
 */
export class BlockIndex {
  /** New blocks recorded lately (halved as the policy's total passes its bound). */
  recentBlocks = 0;
  /** Slot probes past the first, over the index's life: the work hash collisions cost. */
  extraProbes = 0;
  /** Both generations, interleaved; 0 marks an empty slot. */
  private readonly slots: Int32Array;
  /** Which half of each slot pair is the current generation (0 or 1). */
  private current = 0;
  private currentSize = 0;
  private previousSize = 0;
  private readonly generationSize: number;
  private readonly slotKey: number;
  private readonly mask: number;

  /** `slotKey` keys the tables' slot hash; a random one (the default) keeps clients from forging collisions. */
  constructor(maxBlocks: number, slotKey = randomKey32()) {
    this.generationSize = maxBlocks;
    this.slotKey = slotKey;
    this.mask = BlockIndex.maskFor(maxBlocks);
    this.slots = new Int32Array(2 * (this.mask + 1));
  }

  /** The slot mask of an index of `maxBlocks`: each generation has the least power of two ≥ `2 × maxBlocks` slots. */
  static maskFor(maxBlocks: number): number {
    let capacity = 2;
    while (capacity < maxBlocks * 2) capacity *= 2;
    return capacity - 1;
  }

  /** How many block hashes are held (never more than `2 × maxBlocks`). */
  get size(): number {
    return this.currentSize + this.previousSize;
  }

  /** Bytes held by the index's tables. */
  get bytes(): number {
    return this.slots.byteLength;
  }

  has(hash: number): boolean {
    return this.hasAt(hash, homeSlot(hash, this.slotKey, this.mask));
  }

  /** `has`, with the hash's home slot already computed ({@link blockHomes}). */
  hasAt(hash: number, home: number): boolean {
    const key = hash === 0 ? 1 : hash;
    return this.holds(key, home, this.current) || this.holds(key, home, this.current ^ 1);
  }

  /**
   * The number of leading blocks held. Blocks are recorded last-to-first, so a block is
   * never older than the blocks before it in its chain: the held blocks of a chain form a
   * prefix, and a binary search finds its end. Returns 0 early when it cannot reach `toBeat`.
   * `homes`, when given, holds the hashes' home slots ({@link blockHomes}). `guess`, when given,
   * is a likely run (another index's for the same prompt: a family's shared prefix ends at the
   * same block on every rank holding it), checked with two probes before the search: each probe
   * a likely cache miss, against the search's seven or so on a 128-block prompt. The run found is
   * the same with or without it.
   */
  leadingRun(hashes: Int32Array, count: number, toBeat: number, homes?: Int32Array, guess = 0): number {
    if (homes === undefined) homes = blockHomes(hashes, count, this.slotKey, this.mask, new Int32Array(count));
    if (!this.hasAt(hashes[0], homes[0])) return 0;
    let low = 1;
    if (toBeat > 1) {
      if (!this.hasAt(hashes[toBeat - 1], homes[toBeat - 1])) return 0;
      low = toBeat;
    }
    let high = count;
    if (guess >= low && guess <= high) {
      if (guess > low) {
        if (this.hasAt(hashes[guess - 1], homes[guess - 1])) low = guess;
        else high = guess - 1;
      }
      if (low === guess && guess < high) {
        if (this.hasAt(hashes[guess], homes[guess])) low = guess + 1;
        else return guess;
      }
    }
    while (low < high) {
      const middle = (low + high + 1) >>> 1;
      if (this.hasAt(hashes[middle - 1], homes[middle - 1])) low = middle;
      else high = middle - 1;
    }
    return low;
  }

  /**
   * Marks the blocks as just used, last to first so that a prompt's head outlives its tail.
   * Returns how many were not held before. `homes` as for `leadingRun`.
   */
  record(hashes: Int32Array, count: number, homes?: Int32Array): number {
    return this.recordFrom(hashes, count, homes, false);
  }

  /**
   * `record` for a chain (a prompt's block hashes from its first block, each covering all text
   * before it), in an index only ever given chains: it stops at the first block from the end
   * that the current generation holds. The record that last put that block there went on to its
   * chain's head (or stopped, by the same rule, at a block already there), so every block before
   * it is in the current generation or could not be added to it (its probe run is full, and a
   * generation's runs only grow until it is dropped): `record` would leave them all as they are.
   * A generation that turns over mid-record is new and holds only what came after. This is
   * `leadingRun`'s assumption too (a 32-bit collision between chains breaks both). A prompt sent
   * again costs one probe instead of one per block, each a likely cache miss.
   */
  recordChain(hashes: Int32Array, count: number, homes?: Int32Array): number {
    return this.recordFrom(hashes, count, homes, true);
  }

  private recordFrom(hashes: Int32Array, count: number, homes: Int32Array | undefined, chain: boolean): number {
    if (homes === undefined) homes = blockHomes(hashes, count, this.slotKey, this.mask, new Int32Array(count));
    const slots = this.slots;
    let added = 0;
    for (let i = count - 1; i >= 0; i--) {
      const hash = hashes[i];
      const key = hash === 0 ? 1 : hash;
      const home = homes[i];
      const at = this.slotOf(key, home, this.current);
      if (at < 0) continue;
      if (slots[at] === key) {
        if (chain) break;
        continue;
      }
      slots[at] = key;
      this.currentSize++;
      // Only for a hash new to the current generation (adding to one leaves the other as it was).
      if (!this.holds(key, home, this.current ^ 1)) added++;
      if (this.currentSize >= this.generationSize) {
        // The previous generation is dropped; the current one becomes the previous.
        const dropped = this.current ^ 1;
        for (let slot = dropped; slot < slots.length; slot += 2) slots[slot] = 0;
        this.current = dropped;
        this.previousSize = this.currentSize;
        this.currentSize = 0;
      }
    }
    return added;
  }

  /** Whether generation `generation` holds `key`. */
  private holds(key: number, home: number, generation: number): boolean {
    const at = this.slotOf(key, home, generation);
    return at >= 0 && this.slots[at] === key;
  }

  /**
   * Linear probing in one generation: the array position holding `key`, or the empty one where
   * it would go; -1 when `MAX_PROBES` slots hold neither. A hash is never stored more than
   * `MAX_PROBES − 1` slots past its home slot (an insertion that would go further is dropped:
   * the index forgets that block), so a lookup that has probed `MAX_PROBES` slots knows the
   * hash is absent.
   */
  private slotOf(key: number, home: number, generation: number): number {
    const slots = this.slots;
    let slot = home;
    let at = 2 * slot + generation;
    let probed = 1;
    while (slots[at] !== key && slots[at] !== 0) {
      if (probed === MAX_PROBES) return -1;
      probed++;
      this.extraProbes++;
      slot = (slot + 1) & this.mask;
      at = 2 * slot + generation;
    }
    return at;
  }
}

/**
 * Slots a lookup or insertion probes at most. At the tables' load of at most one half, the
 * longest run of occupied slots in a table of 2^16 slots is about 50 with a random slot hash,
 * so the bound almost never turns a hash away, and it caps the work of any one operation
 * whatever the hashes are.
 */
export const MAX_PROBES = 64;
