/**
 * The router's decoder on the KV events vLLM's offloading connector publishes, as recorded from
 * vLLM's own code in both versions (fixtures/vllm-52a31cc/offload-cpu.json at 52a31cc,
 * fixtures/vllm-db92053/offload-cpu.json at upstream main of 2026-08-19; inputs in the READMEs):
 * a GPU prefill's `BlockStored` and the CPU tier's stores and LRU eviction of the same blocks.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from '@jest/globals';
import { Unpackr } from 'msgpackr';
import { decodeKvEventBatch, type KvEvent } from '../../../lib/exact-prefix/events/decode';
import { encodeKvBatch } from '../../../example-server/mock-vllm/kv-events';
import { mockEvent, type VllmEvent, type VllmRecording } from '../vllm-recordings';

type Hash = number | bigint | Uint8Array;

/** An event with its hashes exact, read by msgpackr (independent of the router's decoder): 52a31cc's events are arrays, newer vLLM's maps. */
interface ExactEvent {
  type: string;
  medium: string | null;
  block_hashes: Hash[];
  parent_block_hash?: Hash | null;
  token_ids?: number[];
  block_size?: number;
}

const STORED = ['block_hashes', 'parent_block_hash', 'token_ids', 'block_size', 'lora_id', 'medium'];
const REMOVED = ['block_hashes', 'medium'];

function exactEvents(payload: Buffer): ExactEvent[] {
  const [, events] = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' }).unpack(payload) as [number, unknown[]];
  return events.map((event) => {
    if (!Array.isArray(event)) return event as ExactEvent;
    const [type, ...values] = event as [string, ...unknown[]];
    const names = type === 'BlockStored' ? STORED : REMOVED;
    return Object.fromEntries([['type', type], ...names.map((name, at) => [name, values[at]])]) as ExactEvent;
  });
}

const VERSIONS = ['vllm-52a31cc', 'vllm-db92053'] as const;

function recording(version: (typeof VERSIONS)[number]): VllmRecording {
  return JSON.parse(readFileSync(join(__dirname, '..', 'fixtures', version, 'offload-cpu.json'), 'utf8')) as VllmRecording;
}

/** Every payload of the recording: the published frames, then the replay's (the last two frames of each answer but the end). */
function payloads(recorded: VllmRecording): Buffer[] {
  const published = recorded.frames.map((frames) => Buffer.from(frames[2], 'hex'));
  const replayed = recorded.replay.answer.map((frames) => Buffer.from(frames[frames.length - 1], 'hex')).filter((payload) => payload.length > 0);
  return [...published, ...replayed];
}

/** vLLM's events as its own decoder read them (`vllmDecoded`), as [type, medium, hash count]. */
function vllmShape(recorded: VllmRecording, at: number): Array<[string, string | null, number]> {
  return recorded.vllmDecoded[at].events.map((event) => (event.type === 'AllBlocksCleared' ? ['cleared', null, 0] : [event.type === 'BlockStored' ? 'stored' : 'removed', event.medium, event.block_hashes.length]));
}

function routerShape(events: KvEvent[]): Array<[string, string | null, number]> {
  return events.map((event) => (event.type === 'cleared' ? ['cleared', null, 0] : [event.type, event.medium, event.blockHashes.length]));
}

/** The 64-bit int vLLM publishes for a block hash with its default `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` (vllm/v1/core/kv_cache_utils.py:77-80 at 52a31cc). */
function asInt(hash: Hash): bigint {
  return hash instanceof Uint8Array ? BigInt(`0x${Buffer.from(hash).toString('hex')}`) & 0xffffffffffffffffn : BigInt(hash);
}

describe("the decoder on vLLM's offloading connector events", () => {
  it.each(VERSIONS)('%s: reads every batch, published and replayed, with no event invalid, as vLLM reads it', (version) => {
    const recorded = recording(version);
    const all = payloads(recorded);
    expect(all).toHaveLength(recorded.frames.length + 1);
    for (const [at, payload] of all.entries()) {
      const decoded = decodeKvEventBatch(payload);
      if (!decoded.ok) throw new Error(`${version} payload ${at}: ${decoded.reason}`);
      expect(decoded.batch.invalidEvents).toBe(0);
      expect(decoded.batch.dataParallelRank).toBe(2);
      // The replay (from seq 1) carries the second batch again.
      expect(routerShape(decoded.batch.events)).toEqual(vllmShape(recorded, at < recorded.frames.length ? at : 1));
    }
  });

  it.each(VERSIONS)("%s: the CPU tier's blocks are the GPU's blocks (their hash, no parent, no tokens, block_size 0)", (version) => {
    const events = recording(version).frames.flatMap((frames) => exactEvents(Buffer.from(frames[2], 'hex')));
    const gpu = events.filter((event) => event.type === 'BlockStored' && event.medium === 'GPU').flatMap((event) => event.block_hashes.map(asInt));
    const cpuStored = events.filter((event) => event.type === 'BlockStored' && event.medium === 'CPU');
    expect(cpuStored.length).toBeGreaterThan(0);
    for (const event of cpuStored) {
      expect({ parent: event.parent_block_hash, tokens: event.token_ids, blockSize: event.block_size }).toEqual({ parent: null, tokens: [], blockSize: 0 });
      for (const hash of event.block_hashes) expect(gpu).toContain(asInt(hash));
    }
    // The LRU evicted the first prompt's third block for the second prompt's: the prompt's own are kept.
    const removed = events.filter((event) => event.type === 'BlockRemoved' && event.medium === 'CPU').flatMap((event) => event.block_hashes.map(asInt));
    expect(removed).toEqual([gpu[2]]);
  });

  it('52a31cc publishes the CPU hashes as the 32 bytes of the engine hash, newer vLLM as the GPU events\' int', () => {
    const [old, newer] = VERSIONS.map((version) => recording(version).vllmDecoded[0].events.find((event) => event.type === 'BlockStored' && event.medium === 'CPU'));
    expect(old?.type === 'BlockStored' && old.block_hashes.every((hash) => typeof hash === 'object' && 'bytes' in hash && hash.bytes.length === 64)).toBe(true);
    expect(newer?.type === 'BlockStored' && newer.block_hashes.every((hash) => typeof hash === 'number' || typeof hash === 'bigint')).toBe(true);
  });

  it("newer vLLM's messages are the mock's 'array-batch' layout byte for byte (an array batch of map events, defaults left out)", () => {
    for (const frames of recording('vllm-db92053').frames) {
      const [ts, events, rank] = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' }).unpack(Buffer.from(frames[2], 'hex')) as [number, unknown[], number];
      // The maps carry vLLM's field names, as its decoded events do; hashes exact (msgpackr's bigints).
      const mock = events.map((event) => mockEvent(event as VllmEvent));
      expect(encodeKvBatch({ ts, events: mock, dataParallelRank: rank }, 'array-batch').toString('hex')).toBe(frames[2]);
    }
  });
});
