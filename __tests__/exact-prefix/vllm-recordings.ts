/**
 * The KV events recorded from vLLM 52a31cc's own code (fixtures/vllm-52a31cc, inputs in its
 * README): the frames its publisher sent, and what vLLM's own decoder read back from them,
 * converted into the shapes the router's decoder and the mock's encoder use.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Unpackr } from 'msgpackr';
import type { EngineBlockHash, KvEvent } from '../../lib/exact-prefix/events/decode';
import type { MockKvBatch, MockKvEvent, PyBlockHash } from '../../example-server/mock-vllm/kv-events';

/** A hash as vLLM's decoder holds it: an int, or bytes as `{ bytes: hex }`. */
type VllmHash = number | bigint | { bytes: string };

/** An event as vLLM's decoder (msgspec, typed `KVEventBatch`) read it, field by field. */
export type VllmEvent =
  | {
      type: 'BlockStored';
      block_hashes: VllmHash[];
      parent_block_hash: VllmHash | null;
      token_ids: number[] | null;
      block_size: number;
      lora_id: number | null;
      medium: string | null;
      lora_name: string | null;
      extra_keys: Array<Array<string | number> | null> | null;
      group_idx: number | null;
      kv_cache_spec_kind: string | null;
      kv_cache_spec_sliding_window: number | null;
    }
  | { type: 'BlockRemoved'; block_hashes: VllmHash[]; medium: string | null; group_idx: number | null }
  | { type: 'AllBlocksCleared' };

export interface VllmBatch {
  ts: number;
  events: VllmEvent[];
  data_parallel_rank: number | null;
}

/** One fixture file. */
export interface VllmRecording {
  name: string;
  dataParallelRank: number;
  /** Each message as the SUB received it: topic, sequence, payload (hex). */
  frames: string[][];
  /** The DEALER's request frames and every message the ROUTER answered with (hex). */
  replay: { request: string[]; answer: string[][] };
  vllmDecoded: VllmBatch[];
}

export const RECORDINGS = ['plain', 'plain-bytes', 'lora', 'lora-bytes', 'salt', 'hybrid', 'hybrid-masked', 'hybrid-evict', 'hybrid-window', 'offload'] as const;

/** Reads `fixtures/vllm-52a31cc/<name>.json`. */
export function vllmRecording(name: (typeof RECORDINGS)[number]): VllmRecording {
  return JSON.parse(readFileSync(join(__dirname, 'fixtures', 'vllm-52a31cc', `${name}.json`), 'utf8')) as VllmRecording;
}

/** The payload frame of message `at`. */
export function payloadOf(recording: VllmRecording, at: number): Buffer {
  return Buffer.from(recording.frames[at][2], 'hex');
}

/**
 * The batch of message `at`, field by field as vLLM read it, with its hashes exact: JSON rounds
 * vLLM's 64-bit ints, so they are taken from the payload by msgpackr, a decoder independent of
 * the router's (vLLM's layout: `[ts, events, rank]`, each event `[tag, block_hashes, parent, …]`).
 */
export function decodedBatch(recording: VllmRecording, at: number): VllmBatch {
  const raw = new Unpackr({ useRecords: false, int64AsType: 'bigint' }).unpack(payloadOf(recording, at)) as [number, unknown[][], number];
  const exact = (hash: unknown): VllmHash => (hash instanceof Uint8Array ? { bytes: Buffer.from(hash).toString('hex') } : (hash as VllmHash));
  const batch = recording.vllmDecoded[at];
  return {
    ...batch,
    events: batch.events.map((event, index) => {
      const fields = raw[1][index];
      if (event.type === 'AllBlocksCleared') return event;
      const blockHashes = (fields[1] as unknown[]).map(exact);
      if (event.type === 'BlockRemoved') return { ...event, block_hashes: blockHashes };
      return { ...event, block_hashes: blockHashes, parent_block_hash: fields[2] === null ? null : exact(fields[2]) };
    }),
  };
}

function routerHash(hash: VllmHash): EngineBlockHash {
  if (typeof hash === 'bigint') return Number.isSafeInteger(Number(hash)) && BigInt(Number(hash)) === hash ? Number(hash) : hash;
  if (typeof hash === 'number') return hash;
  return Buffer.from(hash.bytes, 'hex').toString('latin1');
}

function pyHash(hash: VllmHash): PyBlockHash {
  if (typeof hash === 'bigint' || typeof hash === 'number') return hash;
  return Buffer.from(hash.bytes, 'hex');
}

/**
 * What the router's decoder must make of vLLM's event: its fields, with the router's reading of
 * two of them: another tier's store carries no tokens (an offloading connector's `block_size` 0
 * and empty token ids), and a block's extra keys count only beyond the adapter's name.
 */
export function routerEvent(event: VllmEvent): KvEvent {
  switch (event.type) {
    case 'AllBlocksCleared':
      return { type: 'cleared' };
    case 'BlockRemoved':
      return { type: 'removed', blockHashes: event.block_hashes.map(routerHash), medium: event.medium, groupIdx: event.group_idx };
    case 'BlockStored': {
      const gpu = event.medium === null || event.medium === 'GPU';
      // vLLM's first-block keys of a salted prompt: [lora_name?, cache_salt] (kv_cache_utils.py:524-532), keyed by the index as vLLM keys them.
      const first = gpu && event.parent_block_hash === null ? event.extra_keys?.[0] : null;
      const rest = first === null || first === undefined ? [] : first.slice(first[0] === event.lora_name ? 1 : 0);
      const salt = rest.length === 1 && typeof rest[0] === 'string' ? rest[0] : undefined;
      const extraKeyed = !gpu || event.extra_keys === null ? null : event.extra_keys.map((keys, at) => keys !== null && !(keys.length === 1 && keys[0] === event.lora_name) && !(at === 0 && salt !== undefined));
      return {
        type: 'stored',
        blockHashes: event.block_hashes.map(routerHash),
        parentBlockHash: event.parent_block_hash === null ? null : routerHash(event.parent_block_hash),
        tokenIds: gpu ? (event.token_ids ?? []) : [],
        blockSize: event.block_size,
        loraId: event.lora_id,
        loraName: event.lora_name,
        medium: event.medium,
        extraKeyed,
        ...(salt !== undefined && { cacheSalt: salt }),
        groupIdx: event.group_idx,
        kvCacheSpecKind: event.kv_cache_spec_kind,
      };
    }
  }
}

/** vLLM's event as the mock's encoder takes it. */
export function mockEvent(event: VllmEvent): MockKvEvent {
  switch (event.type) {
    case 'AllBlocksCleared':
      return { type: 'AllBlocksCleared' };
    case 'BlockRemoved':
      return { type: 'BlockRemoved', blockHashes: event.block_hashes.map(pyHash), medium: event.medium, groupIdx: event.group_idx };
    case 'BlockStored':
      return {
        type: 'BlockStored',
        blockHashes: event.block_hashes.map(pyHash),
        parentBlockHash: event.parent_block_hash === null ? null : pyHash(event.parent_block_hash),
        tokenIds: event.token_ids ?? [],
        blockSize: event.block_size,
        loraId: event.lora_id,
        medium: event.medium,
        loraName: event.lora_name,
        extraKeys: event.extra_keys,
        groupIdx: event.group_idx,
        kvCacheSpecKind: event.kv_cache_spec_kind,
        kvCacheSpecSlidingWindow: event.kv_cache_spec_sliding_window,
      };
  }
}

/** vLLM's batch as the mock's encoder takes it. */
export function mockBatch(batch: VllmBatch): MockKvBatch {
  return { ts: batch.ts, events: batch.events.map(mockEvent), dataParallelRank: batch.data_parallel_rank };
}
