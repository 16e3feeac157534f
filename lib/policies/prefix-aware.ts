import { hashString } from '../hash';
import type { Endpoint, PickContext, Policy } from '../types';
import { leastOutstanding } from './least-outstanding';

/** Options of {@link prefixAware}. */
export interface PrefixAwareOptions {
  /**
   * Characters per hashed block. Only whole blocks count, as vLLM caches only full blocks.
   * Default: `64` (about vLLM's 16-token block at ~4 characters per token).
   */
  blockChars?: number;
  /**
   * The memory bound: the most block hashes remembered per endpoint. The index keeps the
   * most recently used blocks, between half this number and this number, in fixed tables of
   * `8 × nextPowerOfTwo(maxBlocksPerEndpoint)` bytes: 256 KiB per endpoint for the default
   * `32768` (2 M characters, about 500 K tokens of prompt). Match it to the rank's KV cache,
   * `tokens × 4 / blockChars`, so that the index forgets about when the rank does.
   * Default: `32768`.
   */
  maxBlocksPerEndpoint?: number;
  /**
   * Load imbalance, absolute part: an endpoint is too busy to be chosen for its cache when
   * its load exceeds the least loaded candidate's by more than this **and** by the relative
   * factor. Small, because a prompt's prefix (a shared system prompt) must not draw new
   * sessions onto one endpoint while others idle. Default: `1`.
   */
  imbalanceAbsolute?: number;
  /** Load imbalance, relative part: load above `imbalanceRelative ×` the least loaded's. Default: `2`. */
  imbalanceRelative?: number;
  /**
   * Chooses when no candidate holds a matching block, among equally good matches, and for
   * requests without a prompt. Default: `leastOutstanding()`.
   */
  fallback?: Policy;
}

/** Picks after this many requests drop the index of an endpoint absent from all of them. */
const FORGET_AFTER_PICKS = 4096;

/**
 * Routes a prompt to the endpoint that most likely holds its prefix in the KV cache: the
 * prompt is cut into fixed-size character blocks, chain-hashed (a block's hash covers all
 * text before it, as vLLM's block hashes do), and matched against a bounded per-endpoint
 * index of the blocks it was sent. The endpoint with the longest leading run of matching
 * blocks wins, skipping endpoints too loaded against the least loaded one; with no match
 * the fallback (least-outstanding) decides.
 */
export function prefixAware(options: PrefixAwareOptions = {}): Policy {
  const blockChars = positiveInteger(options.blockChars ?? 64, 'blockChars');
  const maxBlocks = positiveInteger(options.maxBlocksPerEndpoint ?? 32768, 'maxBlocksPerEndpoint');
  const absolute = nonNegative(options.imbalanceAbsolute ?? 1, 'imbalanceAbsolute');
  const relative = nonNegative(options.imbalanceRelative ?? 2, 'imbalanceRelative');
  const fallback = options.fallback ?? leastOutstanding();
  const indexes = new Map<string, BlockIndex>();
  let blockHashes = new Int32Array(256);
  let picks = 0;
  const tied: Endpoint[] = [];

  function hashBlocks(prompt: string): number {
    const count = Math.floor(prompt.length / blockChars);
    if (count > blockHashes.length) blockHashes = new Int32Array(Math.max(count, blockHashes.length * 2));
    let hash = 0;
    for (let i = 0; i < count; i++) {
      hash = hashString(prompt, hash, i * blockChars, (i + 1) * blockChars);
      blockHashes[i] = hash;
    }
    return count;
  }

  function forgetAbsentEndpoints(): void {
    for (const [key, index] of indexes) {
      if (picks - index.lastCandidatePick > FORGET_AFTER_PICKS) indexes.delete(key);
    }
  }

  return {
    name: 'prefix-aware',
    usesPrompt: true,
    pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint {
      const prompt = ctx.prompt;
      const blockCount = prompt === undefined ? 0 : hashBlocks(prompt);
      if (blockCount === 0) return fallback.pick(candidates, ctx);
      if (++picks % FORGET_AFTER_PICKS === 0) forgetAbsentEndpoints();

      let minLoad = Infinity;
      for (const candidate of candidates) if (candidate.load < minLoad) minLoad = candidate.load;
      // SGLang's imbalance test, per endpoint: too busy only when above the least loaded by
      // both margins, so small fleets and busy fleets are both judged sensibly.
      const busyAbove = Math.max(minLoad + absolute, minLoad * relative);

      let bestRun = 0;
      tied.length = 0;
      for (const candidate of candidates) {
        const index = indexes.get(candidate.key);
        if (index === undefined) continue;
        index.lastCandidatePick = picks;
        if (candidate.load > busyAbove) continue;
        const run = index.leadingRun(blockHashes, blockCount, bestRun);
        if (run > bestRun) {
          bestRun = run;
          tied.length = 0;
        }
        if (run === bestRun && run > 0) tied.push(candidate);
      }
      const chosen =
        tied.length === 0 ? fallback.pick(candidates, ctx) : tied.length === 1 ? tied[0] : fallback.pick(tied, ctx);
      tied.length = 0;

      let index = indexes.get(chosen.key);
      if (index === undefined) {
        index = new BlockIndex(maxBlocks);
        index.lastCandidatePick = picks;
        indexes.set(chosen.key, index);
      }
      index.record(blockHashes, blockCount);
      return chosen;
    },
  };
}

/**
 * The block hashes one endpoint was sent, approximately least-recently-used: two
 * generations of at most `maxBlocks / 2` hashes each; when the current one fills, the older
 * is dropped whole. Each generation is an open-addressing hash set in an `Int32Array` at
 * most half full, so a touch is a probe or two with no allocation, and the memory is fixed:
 * `2 × 4 × nextPowerOfTwo(maxBlocks)` bytes (256 KiB for 32768 blocks).
 */
export class BlockIndex {
  lastCandidatePick = 0;
  private current: HashSet32;
  private previous: HashSet32;
  private readonly generationSize: number;

  constructor(maxBlocks: number) {
    this.generationSize = Math.max(1, Math.floor(maxBlocks / 2));
    this.current = new HashSet32(this.generationSize);
    this.previous = new HashSet32(this.generationSize);
  }

  /** How many block hashes are held (never more than `maxBlocks`). */
  get size(): number {
    return this.current.size + this.previous.size;
  }

  /** Bytes held by the index's tables. */
  get bytes(): number {
    return this.current.bytes + this.previous.bytes;
  }

  has(hash: number): boolean {
    return this.current.has(hash) || this.previous.has(hash);
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

  /** Marks the blocks as just used, last to first so that a prompt's head outlives its tail. */
  record(hashes: Int32Array, count: number): void {
    for (let i = count - 1; i >= 0; i--) {
      if (!this.current.add(hashes[i])) continue;
      if (this.current.size >= this.generationSize) {
        const dropped = this.previous;
        this.previous = this.current;
        dropped.clear();
        this.current = dropped;
      }
    }
  }
}

/** A fixed-capacity set of 32-bit hashes with linear probing; 0 marks an empty slot. */
class HashSet32 {
  size = 0;
  private readonly slots: Int32Array;
  private readonly mask: number;

  constructor(maxEntries: number) {
    let capacity = 2;
    while (capacity < maxEntries * 2) capacity *= 2;
    this.slots = new Int32Array(capacity);
    this.mask = capacity - 1;
  }

  get bytes(): number {
    return this.slots.byteLength;
  }

  has(hash: number): boolean {
    const key = hash === 0 ? 1 : hash;
    const slots = this.slots;
    for (let slot = key & this.mask; ; slot = (slot + 1) & this.mask) {
      const held = slots[slot];
      if (held === key) return true;
      if (held === 0) return false;
    }
  }

  /** Adds the hash; returns whether it was new. The owner keeps `size` at most half the slots. */
  add(hash: number): boolean {
    const key = hash === 0 ? 1 : hash;
    const slots = this.slots;
    for (let slot = key & this.mask; ; slot = (slot + 1) & this.mask) {
      const held = slots[slot];
      if (held === key) return false;
      if (held === 0) {
        slots[slot] = key;
        this.size++;
        return true;
      }
    }
  }

  clear(): void {
    this.slots.fill(0);
    this.size = 0;
  }
}

function positiveInteger(value: number, name: string): number {
  if (!Number.isInteger(value) || value < 1) {
    throw new TypeError(`prefixAware: ${name} must be a positive integer (got ${String(value)}).`);
  }
  return value;
}

function nonNegative(value: number, name: string): number {
  if (!Number.isFinite(value) || value < 0) {
    throw new TypeError(`prefixAware: ${name} must be a finite number >= 0 (got ${String(value)}).`);
  }
  return value;
}
