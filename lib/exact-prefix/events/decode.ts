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
 */
import type { Unpackr } from 'msgpackr';
import { loadMsgpackr } from '../optional-deps';
import { scanMsgpack, type MsgpackLimits, type ScanFailure } from './msgpack-scan';
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
  /** `null` (older vLLM) means GPU. */
  medium: string | null;
  /** Per block: whether its hash took extra keys (multimodal inputs, cache_salt, …). */
  extraKeyed: boolean[] | null;
  groupIdx: number | null;
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

export type KvDecodeFailure = ScanFailure | 'malformed' | 'not_a_batch';

export type KvDecodeResult = { ok: true; batch: KvEventBatch } | { ok: false; reason: KvDecodeFailure };

/**
 * Default bounds: a batch is one engine step's events; a 128k-token prefill stored in one
 * step is about 0.7 MB and 130k values, so these leave room without letting one payload
 * hold the process's memory hostage.
 */
export const DEFAULT_KV_LIMITS: Readonly<MsgpackLimits> = Object.freeze({
  maxBytes: 8 * 1024 * 1024,
  maxValues: 2_000_000,
  maxContainerLength: 1_000_000,
  maxDepth: 16,
});

const MAX_HASH_BYTES = 64;
const MAX_TOKEN_ID = 0xffffffff;

// Records off (plain MessagePack), maps as plain objects (msgpackr renames a `__proto__`
// key), 64-bit integers as numbers when safe and bigints otherwise, so hashes stay exact.
let unpackr: Unpackr | undefined;

/** Decodes one payload frame. Never throws, except when msgpackr is not installed. */
export function decodeKvEventBatch(payload: Uint8Array, limits: Readonly<MsgpackLimits> = DEFAULT_KV_LIMITS): KvDecodeResult {
  const scan = scanMsgpack(payload, limits);
  if (scan !== null) return { ok: false, reason: scan };
  // 'auto' (numbers when safe, bigints past 2^53) is in msgpackr's code but not its types.
  unpackr ??= new (loadMsgpackr().Unpackr)({ useRecords: false, mapsAsObjects: true, int64AsType: 'auto' as 'bigint' });
  let raw: unknown;
  try {
    raw = unpackr.unpack(payload);
  } catch {
    return { ok: false, reason: 'malformed' };
  }
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
  for (const item of events) {
    const event = decodeEvent(item);
    if (event === null) invalidEvents++;
    else out.push(event);
  }
  return { ok: true, batch: { ts, dataParallelRank: rank as number | null, events: out, invalidEvents } };
}

// Field order of each event in the array layout, after the tag (vLLM's declaration order;
// later releases append fields, and msgspec leaves out trailing defaults).
const STORED_FIELDS = ['block_hashes', 'parent_block_hash', 'token_ids', 'block_size', 'lora_id', 'medium', 'lora_name', 'extra_keys', 'group_idx'] as const;
const REMOVED_FIELDS = ['block_hashes', 'medium', 'group_idx'] as const;

function decodeEvent(item: unknown): KvEvent | null {
  let tag: unknown;
  let field: (name: string) => unknown;
  if (Array.isArray(item)) {
    tag = item[0];
    field = (name) => {
      const order: readonly string[] = tag === 'BlockStored' ? STORED_FIELDS : REMOVED_FIELDS;
      const at = order.indexOf(name);
      return at < 0 ? undefined : item[at + 1];
    };
  } else if (isMap(item)) {
    tag = item.type;
    field = (name) => item[name];
  } else {
    return null;
  }
  switch (tag) {
    case 'BlockStored':
      return decodeStored(field, Array.isArray(item) ? item.length - 1 : -1);
    case 'BlockRemoved': {
      const blockHashes = hashList(field('block_hashes'));
      const medium = optionalString(field('medium'));
      const groupIdx = optionalCount(field('group_idx'));
      if (blockHashes === null || medium === undefined || groupIdx === undefined) return null;
      return { type: 'removed', blockHashes, medium, groupIdx };
    }
    case 'AllBlocksCleared':
      return { type: 'cleared' };
    default:
      return null;
  }
}

function decodeStored(field: (name: string) => unknown, arrayFields: number): KvBlockStored | null {
  // The array layout always carries the four leading fields; a map may omit the parent.
  if (arrayFields >= 0 && arrayFields < 4) return null;
  const blockHashes = hashList(field('block_hashes'));
  const parentRaw = field('parent_block_hash');
  const parentBlockHash = parentRaw === undefined || parentRaw === null ? null : blockHash(parentRaw);
  const tokenIds = field('token_ids');
  const blockSize = field('block_size');
  const loraId = optionalCount(field('lora_id'));
  const loraName = optionalString(field('lora_name'));
  const medium = optionalString(field('medium'));
  const groupIdx = optionalCount(field('group_idx'));
  if (blockHashes === null || parentBlockHash === undefined || !isCount(blockSize) || blockSize === 0) return null;
  if (loraId === undefined || loraName === undefined || medium === undefined || groupIdx === undefined) return null;
  if (!Array.isArray(tokenIds) || tokenIds.length !== blockHashes.length * blockSize) return null;
  for (const token of tokenIds) {
    if (typeof token !== 'number' || !Number.isInteger(token) || token < 0 || token > MAX_TOKEN_ID) return null;
  }
  const extraRaw = field('extra_keys');
  let extraKeyed: boolean[] | null = null;
  if (extraRaw !== undefined && extraRaw !== null) {
    if (!Array.isArray(extraRaw) || extraRaw.length !== blockHashes.length) return null;
    extraKeyed = extraRaw.map((entry) => entry !== null);
  }
  return { type: 'stored', blockHashes, parentBlockHash, tokenIds: tokenIds as number[], blockSize, loraId, loraName, medium, extraKeyed, groupIdx };
}

function hashList(value: unknown): EngineBlockHash[] | null {
  if (!Array.isArray(value)) return null;
  const out: EngineBlockHash[] = new Array(value.length);
  for (let i = 0; i < value.length; i++) {
    const hash = blockHash(value[i]);
    if (hash === undefined) return null;
    out[i] = hash;
  }
  return out;
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
