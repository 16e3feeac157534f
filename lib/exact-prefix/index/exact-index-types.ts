import type { KvEvent } from '../events/decode';
import type { BlockKeys } from './block-keys';
import type { HashKey } from './keyed-hash';

// What KvExactIndex takes and gives (exact-index.ts), apart from how it keeps its blocks.

/** What is told of the blocks the events store (route receipts). */
export interface BlockObserver {
  /** `rank` stored the block with router key `key`. */
  stored(rank: number, key: number): void;
  /** `rank` stored blocks under a parent the index does not know: they are not indexed. */
  orphaned(rank: number): void;
}

/** What receives decoded events: the subscriber's view of an index. */
export interface KvEventSink {
  /** Applies one event to `rank`; false when the event cannot be applied (counted invalid). */
  applyEvent(rank: number, event: KvEvent): boolean;
  /** Forgets everything `rank` held (its engine restarted or events were lost). */
  clearRank(rank: number): void;
}

export interface KvExactIndexOptions {
  /** The global ranks this index tracks. */
  ranks: readonly number[];
  /**
   * The most blocks held over all ranks (each rank gets an equal share); past it the least
   * recently stored or matched blocks are forgotten. The engines' own removals keep the
   * index at their cache size, so this bound matters only when an engine caches more blocks
   * than its share, or removals were missed. Default 1,048,576 (about 170 MiB at most; see
   * `KV_INDEX_BYTES_PER_BLOCK`).
   */
  maxBlocks?: number;
  /** The hash key; default the process's random key. */
  hashKey?: HashKey;
  /**
   * The most speculative entries held per rank (see `KvExactIndex.speculate`); past it
   * the oldest go first. Default 65,536.
   */
  maxSpeculativeBlocks?: number;
  /** What a block held in a lower tier (by medium: `CPU`, `STORAGE`) is worth against a GPU hit; a medium not named is not scored. Default: none. */
  tierWeights?: Readonly<Record<string, number>>;
}

/** The result of one lookup. */
export interface KvPrefixMatch {
  /** The engine's block size, or 0 before any block was stored. */
  blockSize: number;
  /** Full blocks in the prompt. */
  promptBlocks: number;
  /** Per rank (in the order of `ranks`): leading blocks of the prompt that rank holds. */
  matchedBlocks: Int32Array;
  /** Per rank, where some rank holds lower-tier blocks: `matchedBlocks` plus the weighted blocks past them a lower tier holds (tier-index.ts). */
  weightedBlocks?: Float64Array;
  /**
   * With `weightedBlocks`: per rank, the leading blocks held on the GPU and then in the lower tier
   * that scores best, unweighted. Whether a rank holds the prompt's lead in a tier that is scored:
   * a prefix evicted from every GPU but kept on a CPU tier is not a new one.
   */
  reachedBlocks?: Int32Array;
}

/** Options of `KvExactIndex.match`. */
export interface KvMatchOptions {
  /** The request's LoRA adapter name, when it names one. */
  loraName?: string;
  /** The request's `cache_salt`, when it has one: vLLM keys its first block with it. */
  salt?: string;
  /** The clock speculative entries are judged by (ms). Default `Date.now()`. */
  now?: number;
  /** Where the router keys of the prompt's blocks are kept as far as they are computed, for `KvExactIndex.speculate` to take up. */
  keys?: BlockKeys;
}
