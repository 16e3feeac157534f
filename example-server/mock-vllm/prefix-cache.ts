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
 * 53-bit hash of (previous block hash, text[start, end)): cyrb53 seeded with the previous
 * hash. 53 bits keep collisions negligible at thousands of blocks and stay a plain number key.
 */
export function hashBlock(previous: number, text: string, start: number, end: number): number {
  let h1 = 0xdeadbeef ^ (previous >>> 0);
  let h2 = 0x41c6ce57 ^ Math.floor(previous / 0x100000000);
  for (let i = start; i < end; i++) {
    const code = text.charCodeAt(i);
    h1 = Math.imul(h1 ^ code, 2654435761);
    h2 = Math.imul(h2 ^ code, 1597334677);
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507);
  h1 ^= Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507);
  h2 ^= Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return 0x100000000 * (0x1fffff & h2) + (h1 >>> 0);
}
