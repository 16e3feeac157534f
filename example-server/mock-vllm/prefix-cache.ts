import type { CpuTier } from './cpu-tier';
import type { MockKvEvent } from './kv-events';

/** Characters per token: the mock has no tokenizer. */
export const CHARS_PER_TOKEN = 4;

/** Tokens of a prompt text under the 4-characters-per-token approximation. */
export function countTokens(text: string): number {
  return Math.ceil(text.length / CHARS_PER_TOKEN);
}

/**
 * One rank's prefix cache: full blocks of prompt text, chain-hashed so that a block's key
 * depends on everything before it (as vLLM's block hashes do), kept in a bounded LRU.
 */
export class PrefixCache {
  /** Map insertion order is the LRU order: oldest first. */
  private readonly blocks = new Map<number, true>();
  private readonly blockChars: number;

  constructor(
    private readonly capacityBlocks: number,
    private readonly blockTokens: number,
  ) {
    this.blockChars = blockTokens * CHARS_PER_TOKEN;
  }

  /** Blocks held now. */
  get usedBlocks(): number {
    return this.blocks.size;
  }

  /** Fraction of the capacity in use, like `vllm:kv_cache_usage_perc`. */
  get usage(): number {
    return this.blocks.size / this.capacityBlocks;
  }

  /** Counts the cached leading tokens of `text`, then caches all its full blocks. */
  admit(text: string): number {
    const fullBlocks = Math.floor(text.length / this.blockChars);
    // vLLM always computes the last prompt token, so a prompt that is all full blocks cannot hit its last one.
    const hitEligibleBlocks = Math.floor((countTokens(text) - 1) / this.blockTokens);
    let hash = 0;
    let leadingHits = 0;
    let stillLeading = true;
    for (let block = 0; block < fullBlocks; block++) {
      const start = block * this.blockChars;
      hash = hashBlock(hash, text, start, start + this.blockChars);
      if (stillLeading && block < hitEligibleBlocks && this.blocks.has(hash)) leadingHits++;
      else stillLeading = false;
      this.touch(hash);
    }
    return leadingHits * this.blockTokens;
  }

  private touch(hash: number): void {
    this.blocks.delete(hash);
    this.blocks.set(hash, true);
    if (this.blocks.size > this.capacityBlocks) {
      this.blocks.delete(this.blocks.keys().next().value!);
    }
  }
}

/**
 * 53-bit hash of (previous block hash, units[start, end)), the units being a text's UTF-16
 * code units or token ids: cyrb53 seeded with the previous hash. 53 bits keep collisions
 * negligible at thousands of blocks and stay a plain number key (and a msgpack int).
 */
export function hashBlock(previous: number, units: string | ArrayLike<number>, start: number, end: number): number {
  let h1 = 0xdeadbeef ^ (previous >>> 0);
  let h2 = 0x41c6ce57 ^ Math.floor(previous / 0x100000000);
  const text = typeof units === 'string' ? units : undefined;
  const ids = units as ArrayLike<number>;
  for (let i = start; i < end; i++) {
    const code = text === undefined ? ids[i] : text.charCodeAt(i);
    h1 = Math.imul(h1 ^ code, 2654435761);
    h2 = Math.imul(h2 ^ code, 1597334677);
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507);
  h1 ^= Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507);
  h2 ^= Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return 0x100000000 * (0x1fffff & h2) + (h1 >>> 0);
}

/** What one prompt did to a {@link TokenPrefixCache}. */
export interface TokenAdmission {
  /** Leading prompt tokens found cached on the GPU (whole blocks, the last prompt token excluded). */
  cachedTokens: number;
  /** The tokens of the blocks after those found on the CPU tier, to be loaded rather than computed; 0 without one. */
  cpuCachedTokens: number;
  /** vLLM's KV events for it: `BlockRemoved` for what made room, then `BlockStored` per run of new blocks. */
  events: MockKvEvent[];
}

/** A LoRA adapter a request names (vLLM's `LoRARequest`: `lora_name`, `lora_int_id`). */
export interface MockAdapter {
  readonly name: string;
  readonly id: number;
}

/**
 * One rank's prefix cache in blocks of token ids, as vLLM's block pool keeps it: full blocks
 * only, each keyed by a hash chained over its parent's (the root's parent is 0, or the hash of
 * a LoRA adapter's name: vLLM hashes a LoRA request's blocks with the name among their extra
 * keys, so they never match the base model's), in a bounded LRU that reports what it stores and
 * evicts as vLLM's KV events, every block in group 0 of one full-attention group.
 *
 * Like vLLM, which frees a request's blocks tail first, a prompt's blocks are ranked so that its
 * first block is the most recently used: a parent is never evicted before its child, so what a
 * rank holds is always whole prefixes and its events always name a known parent.
 */
export class TokenPrefixCache {
  /** Map insertion order is the LRU order: oldest first. */
  private readonly blocks = new Map<number, true>();

  constructor(
    private readonly capacityBlocks: number,
    private readonly blockTokens: number,
    /** An offloading connector's CPU tier, written through (cpu-tier.ts); none by default. */
    readonly cpu?: CpuTier,
  ) {}

  /** Blocks held now. */
  get usedBlocks(): number {
    return this.blocks.size;
  }

  /** Fraction of the capacity in use, like `vllm:kv_cache_usage_perc`. */
  get usage(): number {
    return this.blocks.size / this.capacityBlocks;
  }

  /** Drops every block, reporting nothing (a test's fault: removals its subscribers never see). */
  dropSilently(): void {
    this.blocks.clear();
  }

  /**
   * Counts the cached leading tokens of `ids` (under `adapter`'s name and the request's
   * `cacheSalt` when given), then caches its full blocks (at most the capacity's worth).
   */
  admit(ids: readonly number[], adapter?: MockAdapter, cacheSalt?: string): TokenAdmission {
    const size = this.blockTokens;
    // A prompt longer than the whole cache keeps its first blocks (vLLM would not admit it at all).
    const fullBlocks = Math.min(Math.floor(ids.length / size), this.capacityBlocks);
    // vLLM always computes the last prompt token, so a prompt that is all full blocks cannot hit its last one.
    const hitEligibleBlocks = Math.floor((ids.length - 1) / size);
    const hashes: number[] = [];
    let leadingHits = 0;
    let missing = 0;
    const named = adapter === undefined ? 0 : hashBlock(0, adapter.name, 0, adapter.name.length);
    // vLLM keys the prompt's first block with the salt too (kv_cache_utils.py:524-532 at 52a31cc), after the adapter's name.
    const salted = cacheSalt === undefined ? '' : `\u0000salt\u0000${cacheSalt}`;
    const root = cacheSalt === undefined ? named : hashBlock(named, salted, 0, salted.length);
    for (let block = 0, hash = root; block < fullBlocks; block++) {
      hash = hashBlock(hash, ids, block * size, (block + 1) * size);
      hashes.push(hash);
      const held = this.blocks.has(hash);
      if (held && leadingHits === block && block < hitEligibleBlocks) leadingHits++;
      if (!held) missing++;
    }
    // The connector looks up the blocks after the GPU's hits on its tier (scheduler.py:591-606).
    let cpuHits = 0;
    while (this.cpu !== undefined && leadingHits + cpuHits < Math.min(hitEligibleBlocks, hashes.length) && this.cpu.has(hashes[leadingHits + cpuHits])) cpuHits++;
    const events: MockKvEvent[] = [];
    const stored = this.storedEvents(ids, hashes, adapter, cacheSalt);
    // What the prompt holds already is used first, so that making room never evicts it.
    this.rank(hashes, (hash) => this.blocks.has(hash));
    const evicted: number[] = [];
    for (const hash of this.blocks.keys()) {
      if (this.blocks.size - evicted.length + missing <= this.capacityBlocks) break;
      evicted.push(hash);
    }
    for (const hash of evicted) this.blocks.delete(hash);
    // vLLM sends one BlockRemoved per evicted block (block_pool.py _maybe_evict_cached_block).
    for (const hash of evicted) events.push({ type: 'BlockRemoved', blockHashes: [hash], medium: 'GPU', groupIdx: 0 });
    this.rank(hashes, () => true);
    events.push(...stored);
    // The connector's events follow the block pool's in the step's batch (scheduler.py:1554-1565).
    if (this.cpu !== undefined) events.push(...this.cpu.store(hashes));
    return { cachedTokens: leadingHits * size, cpuCachedTokens: cpuHits * size, events };
  }

  /**
   * One `BlockStored` per run of consecutive blocks not held yet, naming the block before it as
   * parent, with vLLM's per-block extra keys (`generate_block_hash_extra_keys`,
   * kv_cache_utils.py:503-538 at 52a31cc): `[lora_name]` for an adapter's blocks (#33304), the
   * salt after it on the prompt's first block (`[lora_name, cache_salt]` or `[cache_salt]`),
   * else none.
   */
  private storedEvents(ids: readonly number[], hashes: readonly number[], adapter: MockAdapter | undefined, cacheSalt: string | undefined): MockKvEvent[] {
    const size = this.blockTokens;
    const events: MockKvEvent[] = [];
    let block = 0;
    while (block < hashes.length) {
      if (this.blocks.has(hashes[block])) {
        block++;
        continue;
      }
      const first = block;
      while (block < hashes.length && !this.blocks.has(hashes[block])) block++;
      events.push({
        type: 'BlockStored',
        blockHashes: hashes.slice(first, block),
        parentBlockHash: first === 0 ? null : hashes[first - 1],
        tokenIds: ids.slice(first * size, block * size),
        blockSize: size,
        loraId: adapter?.id ?? null,
        medium: 'GPU',
        loraName: adapter?.name ?? null,
        extraKeys: Array.from({ length: block - first }, (_, at) => extraKeysOf(first + at, adapter, cacheSalt)),
        groupIdx: 0,
        kvCacheSpecKind: 'full_attention',
      });
    }
    return events;
  }

  /** Makes the prompt's chosen blocks the most recently used, its first block the youngest. */
  private rank(hashes: readonly number[], chosen: (hash: number) => boolean): void {
    for (let block = hashes.length - 1; block >= 0; block--) {
      const hash = hashes[block];
      if (!chosen(hash)) continue;
      this.blocks.delete(hash);
      this.blocks.set(hash, true);
    }
  }
}

/** Block `block`'s extra keys as vLLM lists them: the adapter's name, then (first block only) the salt; null for none. */
function extraKeysOf(block: number, adapter: MockAdapter | undefined, cacheSalt: string | undefined): string[] | null {
  const keys = adapter === undefined ? [] : [adapter.name];
  if (block === 0 && cacheSalt !== undefined) keys.push(cacheSalt);
  return keys.length === 0 ? null : keys;
}
