import type { MockKvEvent } from './kv-events';
import { PrefixCache, TokenPrefixCache, countTokens, type MockAdapter } from './prefix-cache';
import { parsePythonInt } from './python-int';
import type { MockRankStats } from './types';

/** One data-parallel engine of the mock. */
export interface RankState extends MockRankStats {
  readonly globalRank: number;
  /** Blocks of 4-character text, or of token ids when the mock tokenizes (`kvEvents`). */
  readonly cache: PrefixCache | TokenPrefixCache;
}

/** What the rank header asks for. */
export type RankRequest =
  | { kind: 'none' }
  | { kind: 'rank'; rank: RankState }
  | { kind: 'out_of_range'; message: string };

/** Token accounting of one admitted request. */
export interface Admission {
  promptTokens: number;
  cachedTokens: number;
}

/** The options that shape the ranks. */
export interface EngineConfig {
  dataParallelSize: number;
  startRank: number;
  headerMode: 'global' | 'local';
  cacheBlocksPerRank: number;
  blockTokens: number;
  /**
   * Set when the mock tokenizes: ranks cache token blocks, and each admission's KV events go
   * here (the rank's global number, its events in order).
   */
  publishKvEvents?: (globalRank: number, events: MockKvEvent[]) => void;
}

/** The ranks' load, caches and counters, and how a request is placed on one. */
export class MockEngine {
  readonly ranks: readonly RankState[];

  constructor(private readonly config: EngineConfig) {
    this.ranks = Array.from({ length: config.dataParallelSize }, (_, index) => ({
      globalRank: config.startRank + index,
      cache: config.publishKvEvents
        ? new TokenPrefixCache(config.cacheBlocksPerRank, config.blockTokens)
        : new PrefixCache(config.cacheBlocksPerRank, config.blockTokens),
      requests: 0,
      running: 0,
      promptTokens: 0,
      cachedTokens: 0,
    }));
  }

  /**
   * Reads the first header copy (Starlette's `headers.get`) with Python `int()`; what `int()`
   * rejects is ignored, as vLLM's Python server does.
   */
  resolveRankHeader(firstCopy: string | undefined): RankRequest {
    if (firstCopy === undefined) return { kind: 'none' };
    const value = parsePythonInt(firstCopy);
    if (value === null) return { kind: 'none' };
    const lowest = this.config.headerMode === 'local' ? 0 : this.config.startRank;
    const index = Number(value - BigInt(lowest));
    if (index >= 0 && index < this.ranks.length) return { kind: 'rank', rank: this.ranks[index] };
    const end = lowest + this.ranks.length;
    return { kind: 'out_of_range', message: `data_parallel_rank ${value} is out of range [${lowest}, ${end}).` };
  }

  /** vLLM's own pick without a header: least `waiting*4 + running` (no queue here), ties to the lowest rank. */
  pickLeastLoaded(): RankState {
    let best = this.ranks[0];
    for (const rank of this.ranks) {
      if (rank.running < best.running) best = rank;
    }
    return best;
  }

  /**
   * Marks a request running on `rank` and runs its prompts through the prefix cache: their
   * token ids when the mock tokenizes (`tokenIds`, one array per prompt, under the LoRA
   * `adapter` the request names), else their texts.
   */
  admit(rank: RankState, prompts: readonly string[], tokenIds?: readonly number[][], adapter?: MockAdapter): Admission {
    let promptTokens = 0;
    let cachedTokens = 0;
    const { cache } = rank;
    if (cache instanceof TokenPrefixCache) {
      const events: MockKvEvent[] = [];
      for (const ids of tokenIds ?? []) {
        const admitted = cache.admit(ids, adapter);
        promptTokens += ids.length;
        cachedTokens += admitted.cachedTokens;
        events.push(...admitted.events);
      }
      if (events.length > 0) this.config.publishKvEvents?.(rank.globalRank, events);
    } else {
      for (const prompt of prompts) {
        promptTokens += countTokens(prompt);
        cachedTokens += cache.admit(prompt);
      }
    }
    rank.requests++;
    rank.running++;
    rank.promptTokens += promptTokens;
    rank.cachedTokens += cachedTokens;
    return { promptTokens, cachedTokens };
  }

  /** Ends a request admitted on `rank`; the caller guarantees once per admission. */
  release(rank: RankState): void {
    rank.running--;
  }

  /** Counters keyed by global rank. */
  snapshot(): Record<number, MockRankStats> {
    const perRank: Record<number, MockRankStats> = {};
    for (const { globalRank, requests, running, promptTokens, cachedTokens } of this.ranks) {
      perRank[globalRank] = { requests, running, promptTokens, cachedTokens };
    }
    return perRank;
  }

  /** Zeroes the counters; `running` is live state and stays. */
  resetCounters(): void {
    for (const rank of this.ranks) {
      rank.requests = 0;
      rank.promptTokens = 0;
      rank.cachedTokens = 0;
    }
  }
}
