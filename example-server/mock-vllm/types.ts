import type { KvLayout } from './kv-events';

/** Options of {@link startMockVllm}. */
export interface MockVllmOptions {
  /** Bind address. Default: `'127.0.0.1'`. */
  host?: string;
  /** Port; `0` picks a free one. Default: `0`. */
  port?: number;
  /**
   * The engines this server manages, as vLLM's API server counts them: `--data-parallel-size`
   * on an internal-LB server, `--data-parallel-size-local` on a hybrid-LB node, 1 on an
   * external-LB server (`--data-parallel-rank`). Default: `4`.
   */
  dataParallelSize?: number;
  /**
   * The global rank of the first (`--data-parallel-start-rank`, or the `--data-parallel-rank`
   * of an external-LB server). As in vLLM, `X-data-parallel-rank` is an index from 0 into the
   * engines managed, whatever this is: a node serving global ranks 4–7 takes 0–3 and answers
   * `data_parallel_rank 4 is out of range [0, 4).` for 4. `/metrics` labels each engine with its
   * global rank. Default: `0`.
   */
  startRank?: number;
  /** Served model name. Default: `'mock-model'`. */
  model?: string;
  /**
   * Time every rank as vLLM's scheduler does, step by step (mock-vllm/scheduler.ts): a token
   * budget per step, a running limit (`maxNumSeqs`, 256 here by default as vLLM's API server's:
   * vllm/engine/arg_utils.py:2329), prefix-cache hits skipping compute, decode slowing as the
   * running batch grows, one SSE chunk per output token as each step ends, ranks of different
   * speeds. Replaces `prefillMsPerToken` and `decodeMsPerToken` (giving both is an error).
   * `{}` takes every default. Default: `undefined` (each request is timed on its own by those two).
   */
  scheduler?: MockSchedulerOptions;
  /**
   * Each rank's CPU tier, in blocks, as vLLM's OffloadingConnector keeps one (mock-vllm/cpu-tier.ts):
   * written through, LRU, a prompt's blocks found there after its GPU hits loaded instead of
   * recomputed (`scheduler.cpuLoadMsPerToken`), its stores and evictions published as KV events of
   * medium `CPU`. Needs `kvEvents`. Default: `0` (none).
   */
  cpuBlocksPerRank?: number;
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
  /**
   * NIXL: how long a prefill keeps a request's KV blocks for its decode, in ms (vLLM's
   * `kv_lease_duration`): a decode that comes later is answered vLLM's internal error (500; a
   * stream: 200, then the error event). Default: `30_000`.
   */
  kvLeaseMs?: number;
  /** Keep each request's headers and body in its record (tests). Default: `false`. */
  recordBodies?: boolean;
  /** Requests each rank runs at once (vLLM's `--max-num-seqs`); past it they wait, FIFO, in `vllm:num_requests_waiting`. Default: no limit. */
  maxNumSeqs?: number;
  /**
   * LoRA adapters served (vLLM's `--lora-modules NAME=PATH`), listed by `/v1/models` with the
   * served model as parent. A request naming one is cached under it: its blocks match only
   * requests for the same adapter, and their `BlockStored` events carry `lora_id` (from 1, in
   * this order), `lora_name` and `extra_keys` `[[name], …]`, as vLLM's. Default: `[]`.
   */
  loraModules?: string[];
  /**
   * Report `usage.prompt_tokens_details.cached_tokens` as vLLM's `--enable-prompt-tokens-details`
   * does: only when some prompt tokens were cached (vLLM leaves the member out otherwise). vLLM's
   * own default is off. Default: `true`.
   */
  promptTokensDetails?: boolean;
}

/** The timed engine's model of a step (see {@link MockVllmOptions.scheduler}); times are at speed 1. */
export interface MockSchedulerOptions {
  /**
   * Each engine's speed, in local-index order (one number: every engine): a step on an engine of
   * speed 0.5 takes twice as long. Default: `1` for every engine.
   */
  speeds?: number | readonly number[];
  /** A step's fixed cost, in ms: a lone decode's time per output token is about this plus `stepMsPerSeq`. Default: `10`. */
  stepMs?: number;
  /** What each request scheduled in a step adds to it, in ms: decode slows as the running batch grows. Default: `0.25`. */
  stepMsPerSeq?: number;
  /** What each prompt token computed in a step adds to it, in ms. Default: `0.05` (20 000 tokens a second). */
  prefillMsPerToken?: number;
  /** What each prompt token loaded from the CPU tier adds, in ms. Default: a sixth of `prefillMsPerToken`. */
  cpuLoadMsPerToken?: number;
  /** Tokens a step may compute (vLLM's `--max-num-batched-tokens`; 2048 on its API server: vllm/engine/arg_utils.py:2325). Default: `2048`. */
  maxNumBatchedTokens?: number;
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
  /** The payload layout (kv-events.ts `KvLayout`). Default: `'current'`, vLLM's at 52a31cc. */
  layout?: KvLayout;
  /**
   * Publish as a hybrid-attention model does (vLLM #37688, #40984): every event twice, group 0
   * a `sliding_window` group (window: one block) first, as vLLM orders Gemma-3's and gpt-oss's
   * groups, then group 1 `full_attention`. The sliding group drops a prompt's blocks before its
   * last as soon as it stores them (`BlockRemoved` for group 0 only), as vLLM's frees them once
   * the window has passed and evicts them first. Default: `false`.
   */
  hybrid?: boolean;
  /**
   * Publish an offloading connector's events beside the GPU ones (vLLM's OffloadingConnector):
   * a `BlockStored` of medium `CPU`, `block_size` 0, no token ids and no parent for every block
   * stored. Default: `false`.
   */
  offload?: boolean;
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
  /** Of those, tokens found in the rank's (GPU) prefix cache. */
  cachedTokens: number;
  /** Of those, tokens found on the rank's CPU tier after its GPU hits; with `cpuBlocksPerRank` only. */
  cpuCachedTokens?: number;
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
  leg?: 'prefill' | 'decode' | 'whole' | 'refused' | 'failed';
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
  /**
   * Bench hook: what `rank`'s timed engine holds now (`scheduler` option; `undefined` without it):
   * its running requests with the prompt tokens each has left to compute, and the output tokens
   * of those waiting. `bench:slo`'s oracle places by it.
   */
  schedulerState(rank: number): SchedulerState | undefined;
}

/** One rank's timed engine as {@link MockVllm.schedulerState} reads it. */
export interface SchedulerState {
  readonly running: ReadonlyArray<{ readonly prefillLeft: number; readonly emitted: number; readonly outputTokens: number }>;
  readonly waiting: ReadonlyArray<{ readonly outputTokens: number }>;
}
