/** Options of {@link startMockVllm}. */
export interface MockVllmOptions {
  /** Bind address. Default: `'127.0.0.1'`. */
  host?: string;
  /** Port; `0` picks a free one. Default: `0`. */
  port?: number;
  /** Ranks served (`--data-parallel-size`). Default: `4`. */
  dataParallelSize?: number;
  /** First global rank served (`--data-parallel-start-rank`). Default: `0`. */
  startRank?: number;
  /**
   * How `X-data-parallel-rank` is read: the global rank (`'global'`, internal LB and the Rust
   * front end) or the position inside this server, rank − startRank (`'local'`: vLLM's Python
   * server in hybrid LB). Default: `'global'`.
   */
  headerMode?: 'global' | 'local';
  /** Served model name. Default: `'mock-model'`. */
  model?: string;
  /** Simulated prefill time per uncached prompt token, in ms. Default: `0`. */
  prefillMsPerToken?: number;
  /** Simulated time per output token, in ms (SSE chunks are spaced by this). Default: `0`. */
  decodeMsPerToken?: number;
  /** Prefix-cache capacity of each rank, in blocks (LRU). Default: `4096`. */
  cacheBlocksPerRank?: number;
  /**
   * Tokens per cache block. Default: `16`. The mock has no tokenizer: one token is taken to be
   * 4 characters (UTF-16 code units) of prompt text, so a block is `blockTokens × 4` characters.
   */
  blockTokens?: number;
  /** Context length: prompt + output tokens beyond it answer 400, as vLLM does. Default: `131072`. */
  maxModelLen?: number;
}

/** A fault injected into every request from the moment it is set (chaos tests). */
export type MockFault =
  /** Answer with this status and a vLLM error body. */
  | { kind: 'status'; status: number }
  /** Destroy the socket without answering. */
  | { kind: 'reset' }
  /** Never answer (until `close()`). */
  | { kind: 'stall' }
  /** Streaming requests: destroy the socket after this many SSE events. Others are answered. */
  | { kind: 'die-mid-stream'; afterChunks: number };

/** Counters of one rank. */
export interface MockRankStats {
  /** Generation requests admitted on this rank. */
  requests: number;
  /** Requests being served now. */
  running: number;
  /** Prompt tokens (4 characters each) of admitted requests. */
  promptTokens: number;
  /** Of those, tokens found in the rank's prefix cache. */
  cachedTokens: number;
}

/** One received request. */
export interface MockRequestRecord {
  method: string;
  path: string;
  /** Every raw copy of `x-data-parallel-rank`, in arrival order. */
  rankHeaders: string[];
  /** The global rank that served it, or `-1` (not a generation, rejected, or faulted). */
  rank: number;
}

/** A snapshot of the mock's counters. */
export interface MockVllmStats {
  /** Keyed by global rank. */
  perRank: Record<number, MockRankStats>;
  /** The last 10 000 requests, oldest first. */
  requests: MockRequestRecord[];
}

/** A running mock vLLM server. */
export interface MockVllm {
  /** Base URL, e.g. `http://127.0.0.1:41234`. */
  readonly url: string;
  readonly port: number;
  /** Closes the server and destroys every open socket, keep-alive ones included. */
  close(): Promise<void>;
  /** A snapshot of the counters. */
  stats(): MockVllmStats;
  /** Zeroes the counters (the `/metrics` prefix-cache counters too) and the request log; not `running`, not the caches. */
  resetStats(): void;
  /** The fault applied to requests arriving from now on; `undefined` for none. */
  fault: MockFault | undefined;
}
