import type { KvLayout } from './kv-events';

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
   * Tokens per cache block (vLLM's `--block-size`). Default: `16`. Without `kvEvents` the mock
   * has no tokenizer: one token is taken to be 4 characters (UTF-16 code units) of prompt text,
   * so a block is `blockTokens × 4` characters.
   */
  blockTokens?: number;
  /**
   * Publish KV-cache events as vLLM does with `--kv-events-config`. The mock then tokenizes
   * every prompt with its shipped tokenizer (`MOCK_TOKENIZER_DIR`; the chat template for
   * `/v1/chat/completions`, special tokens for `/v1/completions`, exactly as the router's
   * `PromptTokenizer` does), keeps each rank's prefix cache in blocks of `blockTokens` token
   * ids, and publishes `BlockStored` for each newly cached full block and `BlockRemoved` for
   * each evicted one, on a ZeroMQ PUB socket per rank with a replay ROUTER beside it. Token
   * counts (usage, `/metrics`, `stats()`) are then real token counts. `{}` takes every default
   * (ports of the OS's choice, read back from `kvEvents` on the started mock).
   * Default: `undefined` (no events; 4 characters a token).
   */
  kvEvents?: MockKvEventsOptions;
  /** Context length: prompt + output tokens beyond it answer 400, as vLLM does. Default: `131072`. */
  maxModelLen?: number;
  /**
   * The leg of a disaggregated request this server plays (example-server/mock-vllm/pd-roles.ts):
   * `'prefill'` serves `kv_transfer_params.do_remote_decode` requests, `'decode'` the
   * `do_remote_prefill` ones (refusing a transfer no prefill made, or one read already); both
   * serve whole requests. `'both'` ignores `kv_transfer_params`. Default: `'both'`.
   */
  role?: 'prefill' | 'decode' | 'both';
  /** The KV connector played with `role`. Default: `'nixl'`. */
  connector?: 'nixl' | 'mooncake';
  /** A Mooncake prefill's bootstrap server port (`GET /query`); `0` picks a free one. Default: `0`. */
  bootstrapPort?: number;
  /** Keep each request's headers and body in its record (tests). Default: `false`. */
  recordBodies?: boolean;
  /** Requests each rank runs at once (vLLM's `--max-num-seqs`); past it they wait, FIFO, in `vllm:num_requests_waiting`. Default: no limit. */
  maxNumSeqs?: number;
  /**
   * Report `usage.prompt_tokens_details.cached_tokens` as vLLM's `--enable-prompt-tokens-details`
   * does: only when some prompt tokens were cached (vLLM leaves the member out otherwise). vLLM's
   * own default is off. Default: `true`.
   */
  promptTokensDetails?: boolean;
}

/** Where and how the mock publishes KV events (see {@link MockVllmOptions.kvEvents}). */
export interface MockKvEventsOptions {
  /** The address bound. Default: `'127.0.0.1'`. */
  host?: string;
  /**
   * Rank 0's publisher port: global rank r binds `port + r`, as vLLM offsets its endpoint by
   * the global rank (`offset_endpoint_port`). `0`: each rank takes a port of the OS's choice.
   * Default: `0`.
   */
  port?: number;
  /** Rank 0's replay ROUTER port, offset like `port`; `0`: ports of the OS's choice; `null`: no replay socket. Default: `0`. */
  replayPort?: number | null;
  /** The payload layout, one of the msgpack layouts vLLM has shipped. Default: `'map'` (current vLLM). */
  layout?: KvLayout;
  /** The topic frame (vLLM's `KVEventsConfig.topic`). Default: `''`. */
  topic?: string;
  /** Batches kept per rank for replay (vLLM's `buffer_steps`). Default: `10000`. */
  bufferSteps?: number;
}

/** Where a started mock publishes KV events: what a router's subscriber connects to. */
export interface MockKvEvents {
  /** The global ranks published, in order: the order of the endpoint lists. */
  readonly ranks: readonly number[];
  /** Each rank's PUB endpoint, e.g. `tcp://127.0.0.1:41235`, in rank order. */
  readonly endpoints: readonly string[];
  /** Each rank's replay ROUTER endpoint, in rank order (empty with `replayPort: null`). */
  readonly replayEndpoints: readonly string[];
  /** The topic of every message. */
  readonly topic: string;
  /** Tokens per block, as every `BlockStored` says. */
  readonly blockTokens: number;
  /** The directory of the tokenizer the mock tokenizes with (`tokenizer.json`, `tokenizer_config.json`). */
  readonly tokenizer: string;
  /**
   * Test hook: `rank`'s next `batches` batches go to the replay buffer but not on the wire, as
   * a subscriber misses them past the PUB high-water mark. Default: `1`.
   */
  drop(rank: number, batches?: number): void;
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
  | { kind: 'die-mid-stream'; afterChunks: number }
  /** Generations stop at end-of-sequence before their length cap (`finish_reason: "stop"`): a prefill keeps no blocks. */
  | { kind: 'eos' };

/** Counters of one rank. */
export interface MockRankStats {
  /** Generation requests admitted on this rank. */
  requests: number;
  /** Requests being served now. */
  running: number;
  /** Prompt tokens of admitted requests (4 characters each, or the tokenizer's with `kvEvents`). */
  promptTokens: number;
  /** Of those, tokens found in the rank's prefix cache. */
  cachedTokens: number;
  /** Requests waiting for a seat; in `stats()`, with `maxNumSeqs` only. */
  waiting?: number;
  /** The most generation requests the rank held at once, running and waiting, since the last `resetStats()`; in `stats()`, with `maxNumSeqs` only. */
  peakConcurrent?: number;
}

/** One received request. */
export interface MockRequestRecord {
  method: string;
  path: string;
  /** Every raw copy of `x-data-parallel-rank`, in arrival order. */
  rankHeaders: string[];
  /** The global rank that served it, or `-1` (not a generation, rejected, or faulted). */
  rank: number;
  /** With `recordBodies`: the request's headers as Node parsed them. */
  headers?: Record<string, string | string[] | undefined>;
  /** With `recordBodies`: the raw body as text. */
  body?: string;
  /** With `role`: the leg served (`'prefill'`, `'decode'`, `'whole'`) or `'refused'`. */
  leg?: 'prefill' | 'decode' | 'whole' | 'refused';
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
  /** Where KV events are published; `undefined` without the `kvEvents` option. */
  readonly kvEvents: MockKvEvents | undefined;
  /** The fault applied to requests arriving from now on; `undefined` for none. */
  fault: MockFault | undefined;
  /** A Mooncake prefill's bootstrap server port; `undefined` otherwise. */
  readonly bootstrapPort: number | undefined;
  /** With `role`: each served global rank's engine id. */
  readonly engineIds: ReadonlyMap<number, string> | undefined;
  /**
   * Test hook: generation requests on these paths, or whose rank header asks for one of these
   * global ranks, are placed as without a header (vLLM's own balancing), as a front end that does
   * not route them by header would. `undefined`: the header is read as vLLM reads it.
   */
  ignoreRankHeader: { paths?: readonly string[]; ranks?: readonly number[] } | undefined;
  /**
   * Test hook: `rank`'s (every rank's, without one) cached blocks are dropped without a
   * `BlockRemoved` or `AllBlocksCleared` event, as by an engine whose removals never reach its
   * subscribers: an index built from the events then holds blocks the engine does not.
   */
  dropBlocksSilently(rank?: number): void;
}
