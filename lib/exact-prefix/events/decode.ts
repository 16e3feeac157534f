/**
 * vLLM's KV-cache event payloads (vllm/distributed/kv_events.py) decoded into one normalized
 * shape. vLLM encodes them with msgspec, and its releases differ in layout:
 * - `EventBatch` as an array `[ts, events, data_parallel_rank?]` (`array_like=True`) or as a
 *   map `{ts, events, data_parallel_rank}`;
 * - each event as an array with its tag first, `["BlockStored", block_hashes, …]`
 *   (`array_like=True, tag=True`), or as a map with a `type` tag (`tag=True`);
 * - block hashes as integers (64-bit, signed or not) or as bytes (SHA-256 based hashes).
 * Every combination is accepted; fields a later release appends are ignored by earlier
 * readers, as msgspec does. Nothing here throws: a bad payload is a typed failure.
 *
 * vLLM itself has only ever written arrays (every release's `EventBatch` and `KVCacheEvent` are
 * `array_like=True`), and msgspec writes every field of an array_like struct, defaults too
 * (its `omit_defaults` applies to maps only: msgspec issue #720): at 52a31cc a batch is
 * `[ts, events, rank]` and a `BlockStored` the tag and 11 fields (kv_events.py:25-73).
 */
import { MsgpackReader, type MsgpackFailure, type MsgpackLimits } from './msgpack-reader';
import { isRecord } from '../../guards';

/**
 * An engine's block hash: an integer (a number when it is a safe integer, else a bigint) or
 * the hash's bytes as a latin1 string, so that each is a value-compared Map key.
 */
export type EngineBlockHash = number | bigint | string;

/** Blocks the engine cached: `tokenIds` holds `blockHashes.length * blockSize` tokens. */
export interface KvBlockStored {
  type: 'stored';
  blockHashes: EngineBlockHash[];
  parentBlockHash: EngineBlockHash | null;
  tokenIds: number[];
  blockSize: number;
  loraId: number | null;
  loraName: string | null;
  /**
   * `null` (older vLLM) means GPU; any other value is a KV connector's tier (the offloading
   * connector's `CPU`, LMCache's, Mooncake's `cpu`), whose events carry hashes only: their
   * `blockSize` and `tokenIds` are not checked, and read as 0 and empty.
   */
  medium: string | null;
  /**
   * Per block: whether its hash took extra keys beyond the LoRA adapter's name: multimodal
   * inputs, `cache_salt`, prompt embeddings, which token ids cannot reproduce. vLLM puts the
   * adapter's name first in every block's keys of a LoRA request (kv_cache_utils.py
   * `generate_block_hash_extra_keys`, #33304), so `[lora_name]` alone is not extra here: the
   * index keys LoRA blocks under the adapter's name.
   */
  extraKeyed: boolean[] | null;
  /**
   * The `cache_salt` in the first block's extra keys, when the event starts a prompt (no parent):
   * vLLM adds it there, after the adapter's name, on a prompt's first block only
   * (kv_cache_utils.py:524-532 at 52a31cc); that block is then not counted as extra-keyed.
   */
  cacheSalt?: string | null;
  groupIdx: number | null;
  /** The KV-cache group's kind: `full_attention`, `sliding_window`, `mla_attention`, … (vLLM #40984); `null` or absent before. */
  kvCacheSpecKind?: string | null;
}

/** Whether an event's medium is the GPU prefix cache (vLLM's `MEDIUM_GPU`, kv_events.py:46, or unset before it). */
export function onGpu(medium: string | null): boolean {
  return medium === null || medium === 'GPU';
}

/** Blocks the engine evicted. */
export interface KvBlockRemoved {
  type: 'removed';
  blockHashes: EngineBlockHash[];
  medium: string | null;
  groupIdx: number | null;
}

/** The engine dropped its whole prefix cache. */
export interface KvAllBlocksCleared {
  type: 'cleared';
}

export type KvEvent = KvBlockStored | KvBlockRemoved | KvAllBlocksCleared;

/** One decoded `EventBatch`. */
export interface KvEventBatch {
  ts: number;
  /** The publishing engine's global data-parallel rank; `null` when the batch names none. */
  dataParallelRank: number | null;
  events: KvEvent[];
  /** Events skipped because their tag is unknown or a field has the wrong type. */
  invalidEvents: number;
}

export type KvDecodeFailure = MsgpackFailure | 'not_a_batch';

export type KvDecodeResult = { ok: true; batch: KvEventBatch } | { ok: false; reason: KvDecodeFailure };

/**
 * The most tokens one engine step stores, which one batch carries (vLLM publishes a batch per
 * step): at most `--max-num-batched-tokens`, which a long-context server sets up to its
 * context length, 1M tokens for the longest common models.
 */
const MAX_STEP_TOKENS = 1_048_576;
/**
 * Default bounds, from what vLLM 52a31cc writes for one step storing {@link MAX_STEP_TOKENS}
 * (vllm/distributed/kv_events.py:49-96, every field of an `array_like` struct written): a token
 * id is one value of at most 5 bytes; a block of 16 tokens (`--block-size` default) adds its
 * hash (one value, 34 bytes as a 32-byte digest) and at most one `BlockRemoved` for the block it
 * evicts (6 values, about 55 bytes); each event adds a dozen values. That is under 1.5 values and
 * 11 bytes a token: these bounds leave room for it. A payload at them is decoded in slices
 * (decodeKvEventBatchCooperatively), so they bound memory, not the longest pause; a payload past
 * them is refused (the rank's index keeps what it knew, apply-batch.ts).
 */
export const DEFAULT_KV_LIMITS: Readonly<MsgpackLimits> = Object.freeze({
  maxBytes: 16 * MAX_STEP_TOKENS,
  maxValues: 2 * MAX_STEP_TOKENS,
  maxContainerLength: 2 * MAX_STEP_TOKENS,
  maxDepth: 16,
});

const MAX_HASH_BYTES = 64;
const MAX_TOKEN_ID = 0xffffffff;

/**
 * Values decoded or checked between two points where a cooperative decode may yield:
 * ~0.1–0.3 ms of work on an idle core.
 */
export const DECODE_CHUNK = 4_096;

/** Decodes one payload frame whole, without yielding (tests, benchmarks). Never throws. */
export function decodeKvEventBatch(payload: Uint8Array, limits: Readonly<MsgpackLimits> = DEFAULT_KV_LIMITS): KvDecodeResult {
  const steps = decodeSteps(payload, limits);
  for (;;) {
    const next = steps.next();
    if (next.done === true) return next.value;
  }
}

/**
 * Decodes one payload frame, calling `pause(values)` after every 1 to 2 × DECODE_CHUNK values
 * decoded or checked and waiting whenever it returns a promise: the subscriber passes the stream's
 * work budget (cooperative.ts), so request handling runs between slices of one payload.
 */
export async function decodeKvEventBatchCooperatively(
  payload: Uint8Array,
  limits: Readonly<MsgpackLimits>,
  pause: (values: number) => Promise<void> | undefined,
): Promise<KvDecodeResult> {
  const steps = decodeSteps(payload, limits);
  for (;;) {
    const next = steps.next();
    if (next.done === true) return next.value;
    const wait = pause(next.value);
    if (wait !== undefined) await wait;
  }
}

/** The decode, as a generator yielding the values done since its last yield. */
function* decodeSteps(payload: Uint8Array, limits: Readonly<MsgpackLimits>): Generator<number, KvDecodeResult, void> {
  const reader = new MsgpackReader(payload, limits);
  while (!reader.step(DECODE_CHUNK)) yield DECODE_CHUNK;
  const read = reader.result();
  if (!read.ok) return read;
  const raw = read.value;
  let ts: unknown;
  let events: unknown;
  let rank: unknown;
  if (Array.isArray(raw)) {
    [ts, events, rank] = raw;
  } else if (isMap(raw)) {
    ts = raw.ts;
    events = raw.events;
    rank = raw.data_parallel_rank;
  } else {
    return { ok: false, reason: 'not_a_batch' };
  }
  if (typeof ts !== 'number' || !Array.isArray(events)) return { ok: false, reason: 'not_a_batch' };
  if (rank === undefined) rank = null;
  if (rank !== null && !isCount(rank)) return { ok: false, reason: 'not_a_batch' };
  const out: KvEvent[] = [];
  let invalidEvents = 0;
  let done = 0;
  for (const item of events) {
    const fields = eventFields(item);
    let event: KvEvent | null = null;
    if (fields !== null && (fields.tag === 'BlockStored' || fields.tag === 'BlockRemoved')) {
      // An event's arrays are checked element by element: a large one in chunks, yielding
      // between them (small ones whole, without a generator's cost).
      const rawHashes = fieldOf(fields, 'block_hashes');
      let hashes: EngineBlockHash[] | null = null;
      if (Array.isArray(rawHashes)) {
        const into: EngineBlockHash[] = new Array(rawHashes.length);
        const check = (from: number, to: number) => convertHashes(rawHashes, into, from, to);
        if (rawHashes.length <= DECODE_CHUNK) {
          if (check(0, rawHashes.length)) hashes = into;
          done += rawHashes.length;
        } else if (yield* inChunks(rawHashes.length, check)) {
          hashes = into;
        }
        if (done >= DECODE_CHUNK) {
          yield done;
          done = 0;
        }
      }
      if (fields.tag === 'BlockRemoved') {
        event = decodeRemoved(fields, hashes);
      } else {
        const tokens = fieldOf(fields, 'token_ids');
        const medium = optionalString(fieldOf(fields, 'medium'));
        // Another tier's tokens are not read, so not checked.
        let tokensValid = medium !== undefined && !onGpu(medium);
        if (!tokensValid && hashes !== null && Array.isArray(tokens)) {
          const check = (from: number, to: number) => validTokens(tokens, from, to);
          if (tokens.length <= DECODE_CHUNK) {
            tokensValid = check(0, tokens.length);
            done += tokens.length;
          } else {
            tokensValid = yield* inChunks(tokens.length, check);
          }
        }
        event = decodeStored(fields, hashes, tokensValid);
      }
    } else if (fields !== null && fields.tag === 'AllBlocksCleared') {
      event = { type: 'cleared' };
    }
    if (event === null) invalidEvents++;
    else out.push(event);
    if (++done >= DECODE_CHUNK) {
      yield done;
      done = 0;
    }
  }
  return { ok: true, batch: { ts, dataParallelRank: rank as number | null, events: out, invalidEvents } };
}

/** Runs `check` over [0, length) a chunk at a time, yielding each chunk's size after it; false at the first chunk that fails. */
function* inChunks(length: number, check: (from: number, to: number) => boolean): Generator<number, boolean, void> {
  for (let from = 0; from < length; from += DECODE_CHUNK) {
    const to = Math.min(length, from + DECODE_CHUNK);
    if (!check(from, to)) return false;
    yield to - from;
  }
  return true;
}

// Field order of each event in the array layout, after the tag (vLLM's declaration order;
// later releases append fields, so older ones wrote shorter arrays).
const STORED_FIELDS = ['block_hashes', 'parent_block_hash', 'token_ids', 'block_size', 'lora_id', 'medium', 'lora_name', 'extra_keys', 'group_idx', 'kv_cache_spec_kind'] as const;
const REMOVED_FIELDS = ['block_hashes', 'medium', 'group_idx'] as const;

/** An event's tag and where its fields are: an array in field order, or a map. */
interface EventFields {
  tag: unknown;
  item: unknown[] | Record<string, unknown>;
  /** Field names in array order; null for a map. */
  order: readonly string[] | null;
}

function eventFields(item: unknown): EventFields | null {
  if (Array.isArray(item)) return { tag: item[0], item, order: item[0] === 'BlockStored' ? STORED_FIELDS : REMOVED_FIELDS };
  if (isMap(item)) return { tag: item.type, item, order: null };
  return null;
}

// Plain functions, not a closure per event: a payload may hold 100k events.
function fieldOf({ item, order }: EventFields, name: string): unknown {
  if (order === null) return (item as Record<string, unknown>)[name];
  const at = order.indexOf(name);
  return at < 0 ? undefined : (item as unknown[])[at + 1];
}

function decodeRemoved(fields: EventFields, blockHashes: EngineBlockHash[] | null): KvBlockRemoved | null {
  const medium = optionalString(fieldOf(fields, 'medium'));
  const groupIdx = optionalCount(fieldOf(fields, 'group_idx'));
  if (blockHashes === null || medium === undefined || groupIdx === undefined) return null;
  return { type: 'removed', blockHashes, medium, groupIdx };
}

/** `blockHashes` converted and `tokensValid` (each token an id, or another tier's event) checked by the caller. */
function decodeStored(fields: EventFields, blockHashes: EngineBlockHash[] | null, tokensValid: boolean): KvBlockStored | null {
  // The array layout always carries the four leading fields; a map may omit the parent.
  if (fields.order !== null && (fields.item as unknown[]).length - 1 < 4) return null;
  const parentRaw = fieldOf(fields, 'parent_block_hash');
  const parentBlockHash = parentRaw === undefined || parentRaw === null ? null : blockHash(parentRaw);
  const loraId = optionalCount(fieldOf(fields, 'lora_id'));
  const loraName = optionalString(fieldOf(fields, 'lora_name'));
  const medium = optionalString(fieldOf(fields, 'medium'));
  const groupIdx = optionalCount(fieldOf(fields, 'group_idx'));
  const kvCacheSpecKind = optionalString(fieldOf(fields, 'kv_cache_spec_kind'));
  if (blockHashes === null || !tokensValid || parentBlockHash === undefined) return null;
  if (loraId === undefined || loraName === undefined || medium === undefined || groupIdx === undefined || kvCacheSpecKind === undefined) return null;
  if (!onGpu(medium)) {
    // An offloading connector's store: no parent, block size 0, no token ids (offloading/scheduler.py take_events).
    const size = fieldOf(fields, 'block_size');
    return { type: 'stored', blockHashes, parentBlockHash, tokenIds: [], blockSize: isCount(size) ? size : 0, loraId, loraName, medium, extraKeyed: null, groupIdx, kvCacheSpecKind };
  }
  const tokenIds = fieldOf(fields, 'token_ids') as number[];
  const blockSize = fieldOf(fields, 'block_size');
  if (!isCount(blockSize) || blockSize === 0) return null;
  // The token ids run from the first new block to the last (block_pool.py cache_full_blocks), and a
  // sliding-window group leaves out the hashes of blocks it masks: more ids than hashes × size.
  if (tokenIds.length % blockSize !== 0 || tokenIds.length < blockHashes.length * blockSize) return null;
  const extraRaw = fieldOf(fields, 'extra_keys');
  let extraKeyed: boolean[] | null = null;
  if (extraRaw !== undefined && extraRaw !== null) {
    if (!Array.isArray(extraRaw) || extraRaw.length !== blockHashes.length) return null;
    extraKeyed = extraRaw.map((entry) => entry !== null && !(Array.isArray(entry) && entry.length === 1 && entry[0] === loraName && loraName !== null));
    const salt = parentBlockHash === null ? saltOf(extraRaw[0], loraName) : undefined;
    if (salt !== undefined) {
      extraKeyed[0] = false;
      return { type: 'stored', blockHashes, parentBlockHash, tokenIds, blockSize, loraId, loraName, medium, extraKeyed, cacheSalt: salt, groupIdx, kvCacheSpecKind };
    }
  }
  return { type: 'stored', blockHashes, parentBlockHash, tokenIds, blockSize, loraId, loraName, medium, extraKeyed, groupIdx, kvCacheSpecKind };
}

/** A first block's salt: its extra keys `[cache_salt]`, or `[lora_name, cache_salt]` for an adapter's (mm keys are tuples, prompt embeddings bytes). */
function saltOf(keys: unknown, loraName: string | null): string | undefined {
  if (!Array.isArray(keys)) return undefined;
  const rest = loraName !== null && keys[0] === loraName ? 1 : 0;
  return keys.length === rest + 1 && typeof keys[rest] === 'string' && keys[rest] !== '' ? keys[rest] : undefined;
}

function convertHashes(raw: unknown[], into: EngineBlockHash[], from: number, to: number): boolean {
  for (let i = from; i < to; i++) {
    const hash = blockHash(raw[i]);
    if (hash === undefined) return false;
    into[i] = hash;
  }
  return true;
}

function validTokens(tokens: unknown[], from: number, to: number): boolean {
  for (let i = from; i < to; i++) {
    const token = tokens[i];
    if (typeof token !== 'number' || !Number.isInteger(token) || token < 0 || token > MAX_TOKEN_ID) return false;
  }
  return true;
}

function blockHash(value: unknown): EngineBlockHash | undefined {
  if (typeof value === 'number') return Number.isInteger(value) ? value : undefined;
  if (typeof value === 'bigint') return value;
  if (value instanceof Uint8Array && value.length > 0 && value.length <= MAX_HASH_BYTES) {
    return Buffer.from(value.buffer, value.byteOffset, value.length).toString('latin1');
  }
  return undefined;
}

function optionalString(value: unknown): string | null | undefined {
  if (value === undefined || value === null) return null;
  return typeof value === 'string' ? value : undefined;
}

function optionalCount(value: unknown): number | null | undefined {
  if (value === undefined || value === null) return null;
  return isCount(value) ? value : undefined;
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}

/** A msgpack map: an object that is neither an array nor binary. */
function isMap(value: unknown): value is Record<string, unknown> {
  return isRecord(value) && !(value instanceof Uint8Array);
}
