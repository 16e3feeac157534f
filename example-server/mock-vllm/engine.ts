import { CpuTier } from './cpu-tier';
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
  /** Found in the rank's GPU prefix cache. */
  cachedTokens: number;
  /** Found on its CPU tier after those: loaded, not computed. */
  cpuCachedTokens: number;
}

/** The options that shape the ranks. */
export interface EngineConfig {
  /** The engines this server manages (`--data-parallel-size`, or `--data-parallel-size-local` on a hybrid node). */
  dataParallelSize: number;
  /** The global rank of the first (`--data-parallel-start-rank`, or `--data-parallel-rank` in external LB). */
  startRank: number;
  cacheBlocksPerRank: number;
  blockTokens: number;
  /** Each rank's CPU tier, in blocks (an offloading connector's); 0: none. Needs `publishKvEvents` (token blocks). */
  cpuBlocksPerRank?: number;
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
        ? new TokenPrefixCache(config.cacheBlocksPerRank, config.blockTokens, config.cpuBlocksPerRank ? new CpuTier(config.cpuBlocksPerRank) : undefined)
        : new PrefixCache(config.cacheBlocksPerRank, config.blockTokens),
      requests: 0,
      running: 0,
      promptTokens: 0,
      cachedTokens: 0,
      ...(config.cpuBlocksPerRank ? { cpuCachedTokens: 0 } : {}),
    }));
  }

  /**
   * Reads the first header copy (Starlette's `headers.get`) with Python `int()`; what `int()`
   * rejects is ignored, as vLLM's Python server does. The value is an index from 0 into the
   * engines this server manages, in every load-balancing mode: vLLM 52a31cc checks it against
   * `[0, num_ranks)`, `num_ranks` being `data_parallel_size_local` on a hybrid or external-LB
   * server and `data_parallel_size` otherwise (vllm/v1/engine/input_processor.py:252-259), and
   * picks `core_engines[rank]` of the engines it manages, `engine_ranks_managed = range(start,
   * start + num_ranks)` (vllm/v1/engine/core_client.py:596-606, 1382-1407).
   */
  resolveRankHeader(firstCopy: string | undefined): RankRequest {
    if (firstCopy === undefined) return { kind: 'none' };
    const value = parsePythonInt(firstCopy);
    if (value === null) return { kind: 'none' };
    if (value >= 0n && value < BigInt(this.ranks.length)) return { kind: 'rank', rank: this.ranks[Number(value)] };
    return { kind: 'out_of_range', message: `data_parallel_rank ${value} is out of range [0, ${this.ranks.length}).` };
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
  admit(rank: RankState, prompts: readonly string[], tokenIds?: readonly number[][], adapter?: MockAdapter, cacheSalt?: string): Admission {
    let promptTokens = 0;
    let cachedTokens = 0;
    let cpuCachedTokens = 0;
    const { cache } = rank;
    if (cache instanceof TokenPrefixCache) {
      const events: MockKvEvent[] = [];
      for (const ids of tokenIds ?? []) {
        const admitted = cache.admit(ids, adapter, cacheSalt);
        promptTokens += ids.length;
        cachedTokens += admitted.cachedTokens;
        cpuCachedTokens += admitted.cpuCachedTokens;
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
    if (rank.cpuCachedTokens !== undefined) rank.cpuCachedTokens += cpuCachedTokens;
    return { promptTokens, cachedTokens, cpuCachedTokens };
  }

  /** Ends a request admitted on `rank`; the caller guarantees once per admission. */
  release(rank: RankState): void {
    rank.running--;
  }

  /** Counters keyed by global rank. */
  snapshot(): Record<number, MockRankStats> {
    const perRank: Record<number, MockRankStats> = {};
    for (const { globalRank, requests, running, promptTokens, cachedTokens, cpuCachedTokens } of this.ranks) {
      perRank[globalRank] = { requests, running, promptTokens, cachedTokens, ...(cpuCachedTokens !== undefined && { cpuCachedTokens }) };
    }
    return perRank;
  }

  /** Zeroes the counters; `running` is live state and stays. */
  resetCounters(): void {
    for (const rank of this.ranks) {
      rank.requests = 0;
      rank.promptTokens = 0;
      rank.cachedTokens = 0;
      if (rank.cpuCachedTokens !== undefined) rank.cpuCachedTokens = 0;
    }
  }
}
