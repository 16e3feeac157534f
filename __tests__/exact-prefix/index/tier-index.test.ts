import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Packr } from 'msgpackr';
import { decodeKvEventBatch, type EngineBlockHash, type KvEvent } from '../../../lib/exact-prefix/events/decode';
import { KvExactIndex } from '../../../lib/exact-prefix/index/exact-index';
import { mediumLabel } from '../../../lib/exact-prefix/index/tier-index';

/*
 * What vLLM's offloading connector publishes, from its source (docs/slo-routing.md):
 * - 52a31cc, vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py:946-965
 *   (`take_events`): per offloaded chunk `BlockStored(block_hashes=[get_offload_block_hash(key)],
 *   parent_block_hash=None, token_ids=[], lora_id=None, block_size=0, medium=event.medium,
 *   lora_name=None)` and `BlockRemoved(block_hashes, medium)`; the key is made from the request's
 *   block hash of the chunk's last block (scheduler.py:192-206 `update_offload_keys`, every
 *   `hash_block_size_factor`-th hash; kv_offload/base.py:31-38) and published as raw bytes, while
 *   the GPU's events carry the same hash as `int.from_bytes(h, "big") & (2**64 - 1)`
 *   (v1/core/kv_cache_utils.py:77-80, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` default 1, envs.py:1787).
 *   The medium is `"CPU"` (v1/kv_offload/cpu/common.py:12).
 * - newer vLLM (andrewor14 mirror HEAD), offloading/events.py:317-335 (`_placeholder_stored`):
 *   the same placeholder with the hash converted as the GPU's (`maybe_convert_block_hash`),
 *   `group_idx` and `locality` added; events are maps since #42892 (kv_events.py:36-41, `tag=True`
 *   without `array_like`, `omit_defaults=True`), the batch still an array (kv_events.py:25-33).
 */

const BLOCK = 4;
/** The GPU hashes of blocks 1..4 of prompt 1..16, as 64-bit integers (the low 8 bytes of 32-byte hashes). */
const LOW = [0x0123456789abcdefn, 0x1111222233334444n, 0x7edcba9876543210n, 0x0aaaaaaaaaaaaaaan];
/** A number when it is a safe integer, as the decoder gives it, else a bigint. */
const asDecoded = (value: bigint): EngineBlockHash => (value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value);
/** Block b's 32-byte hash as 52a31cc's CPU events carry it: raw bytes (latin1 in the decoder), its low 8 bytes the GPU's integer. */
function rawBytes(b: number): string {
  const bytes = Buffer.alloc(32, 0x5a + b);
  bytes.writeBigUInt64BE(LOW[b], 24);
  return bytes.toString('latin1');
}

const tokens = Array.from({ length: 16 }, (_, i) => i + 1);
const gpuStore: KvEvent = { type: 'stored', blockHashes: LOW.map(asDecoded), parentBlockHash: null, tokenIds: tokens, blockSize: BLOCK, loraId: null, loraName: null, medium: 'GPU', extraKeyed: null, groupIdx: 0 };
/** A CPU chunk of two blocks, named by its last block's hash (`hash_block_size_factor` 2). */
const cpuStore = (hash: EngineBlockHash): KvEvent => ({ type: 'stored', blockHashes: [hash], parentBlockHash: null, tokenIds: [], blockSize: 0, loraId: null, loraName: null, medium: 'CPU', extraKeyed: null, groupIdx: null });
const gpuRemove = (blocks: number[]): KvEvent => ({ type: 'removed', blockHashes: blocks.map((b) => asDecoded(LOW[b])), medium: 'GPU', groupIdx: 0 });

function indexed(tierWeights: Record<string, number> = { GPU: 1, CPU: 0.8 }): KvExactIndex {
  const index = new KvExactIndex({ ranks: [0, 1], tierWeights });
  expect(index.applyEvent(0, gpuStore)).toBe(true);
  expect(index.applyEvent(1, gpuStore)).toBe(true);
  return index;
}

describe('lower KV-cache tiers in the exact index', () => {
  it("scores blocks vLLM 52a31cc offloaded to CPU (raw-bytes hashes) past the GPU run at the CPU's weight", () => {
    const index = indexed();
    // Rank 0 offloads both chunks (named by blocks 2 and 4), then the GPU evicts blocks 3 and 4; rank 1 keeps its GPU copy of 1..2 only.
    expect(index.applyEvent(0, cpuStore(rawBytes(1)))).toBe(true);
    expect(index.applyEvent(0, cpuStore(rawBytes(3)))).toBe(true);
    expect(index.applyEvent(0, gpuRemove([2, 3]))).toBe(true);
    expect(index.applyEvent(1, gpuRemove([2, 3]))).toBe(true);
    const match = index.match(tokens);
    expect(Array.from(match.matchedBlocks)).toEqual([2, 2]);
    // Rank 0: 2 GPU blocks + 2 CPU blocks × 0.8.
    expect(Array.from(match.weightedBlocks!)).toEqual([2 + 2 * 0.8, 2]);
    // How far each rank holds the prompt in a scored tier, unweighted: rank 0 all 4 blocks (a prefix not new there), rank 1 its GPU run.
    expect(Array.from(match.reachedBlocks!)).toEqual([4, 2]);
    expect(index.tiers.counts(0)).toEqual([['CPU', 2]]);
  });

  it("follows the CPU tier's removals, which leave the GPU's blocks alone", () => {
    const index = indexed();
    index.applyEvent(0, cpuStore(rawBytes(3)));
    index.applyEvent(0, gpuRemove([2, 3]));
    expect(index.match(tokens).weightedBlocks![0]).toBeCloseTo(3.6);
    index.applyEvent(0, { type: 'removed', blockHashes: [rawBytes(3)], medium: 'CPU', groupIdx: null });
    const match = index.match(tokens);
    expect(match.matchedBlocks[0]).toBe(2);
    expect(match.weightedBlocks).toBeUndefined();
    // A CPU removal of a hash the GPU holds touches no GPU block.
    index.applyEvent(0, { type: 'removed', blockHashes: [asDecoded(LOW[0])], medium: 'CPU', groupIdx: null });
    expect(index.match(tokens).matchedBlocks[0]).toBe(2);
  });

  it('scores a medium without a weight not at all, and an offloaded hash the GPU never stored nowhere', () => {
    const index = indexed({ GPU: 1, CPU: 0.8 });
    index.applyEvent(0, { ...(cpuStore(asDecoded(LOW[3])) as object), medium: 'STORAGE' } as KvEvent);
    index.applyEvent(0, cpuStore(rawBytes(3).replace(/.$/, 'x')));
    index.applyEvent(0, gpuRemove([2, 3]));
    expect(index.match(tokens).weightedBlocks).toBeUndefined();
    expect(mediumLabel('cpu')).toBe('CPU');
    expect(mediumLabel('NVME')).toBe('OTHER');
  });

  it("decodes newer vLLM's map-encoded offload placeholders (integer hashes, group_idx, locality) as valid events and indexes them", () => {
    // kv_events.py (HEAD): EventBatch array [ts, events, data_parallel_rank]; events maps tagged `type`,
    // defaults omitted (extra_keys, kv_cache_spec_*), `locality` set by tiers that know it.
    const low = [0x1234n, 0x5678n, 0x9abcn, 0xdef0n];
    const gpu = { type: 'BlockStored', block_hashes: low.map(Number), parent_block_hash: null, token_ids: tokens, block_size: BLOCK, lora_id: null, medium: 'GPU', lora_name: null, group_idx: 0, kv_cache_spec_kind: 'full_attention' };
    const placeholder = { type: 'BlockStored', block_hashes: [Number(low[3])], parent_block_hash: null, token_ids: [], block_size: 0, lora_id: null, medium: 'CPU', lora_name: null, group_idx: 0, locality: 'LOCAL' };
    const removal = { type: 'BlockRemoved', block_hashes: [Number(low[2]), Number(low[3])], medium: 'GPU', group_idx: 0 };
    const payload = new Packr({ useRecords: false }).pack([1767225606.0, [gpu, placeholder, removal], 0]);
    const decoded = decodeKvEventBatch(payload);
    expect(decoded.ok).toBe(true);
    if (!decoded.ok) return;
    expect(decoded.batch.invalidEvents).toBe(0);
    expect(decoded.batch.events.map((event) => event.type)).toEqual(['stored', 'stored', 'removed']);
    const index = new KvExactIndex({ ranks: [0], tierWeights: { GPU: 1, CPU: 0.8 } });
    for (const event of decoded.batch.events) expect(index.applyEvent(0, event)).toBe(true);
    const match = index.match(tokens);
    expect(match.matchedBlocks[0]).toBe(2);
    expect(match.weightedBlocks![0]).toBeCloseTo(3.6);
  });
});

describe("lower tiers from vLLM's own offload events (fixtures/*/offload-cpu.json, recorded by vLLM's code)", () => {
  const versions = ['vllm-52a31cc', 'vllm-db92053'] as const;
  /** Every published batch of the recording applied to rank 2's index (the publisher's rank); every event must apply. */
  function fed(version: (typeof versions)[number]): { index: KvExactIndex; gpuHashes: EngineBlockHash[][] } {
    const recorded = JSON.parse(readFileSync(join(__dirname, '..', 'fixtures', version, 'offload-cpu.json'), 'utf8')) as { frames: string[][] };
    const index = new KvExactIndex({ ranks: [2], tierWeights: { GPU: 1, CPU: 0.8 } });
    const gpuHashes: EngineBlockHash[][] = [];
    for (const frames of recorded.frames) {
      const decoded = decodeKvEventBatch(Buffer.from(frames[2], 'hex'));
      if (!decoded.ok) throw new Error(decoded.reason);
      expect(decoded.batch.invalidEvents).toBe(0);
      for (const event of decoded.batch.events) {
        expect(index.applyEvent(2, event)).toBe(true);
        if (event.type === 'stored' && event.medium === 'GPU') gpuHashes.push(event.blockHashes);
      }
    }
    return { index, gpuHashes };
  }
  const second = [1, 2, 3, 4, 5, 6, 7, 8, 30, 31, 32, 33, 34];

  it.each(versions)('%s: the CPU tier holds the second prompt’s blocks; evicted from the GPU, its third block scores 0.8', (version) => {
    const { index, gpuHashes } = fed(version);
    // The CPU tier holds 3 blocks: the first prompt's first two and the second prompt's third (the LRU evicted the first prompt's third).
    expect(index.tiers.counts(0)).toEqual([['CPU', 3]]);
    expect(index.match(second).matchedBlocks[0]).toBe(3);
    // The GPU evicts the second prompt's third block, as block_pool.py:391-397 publishes it (medium GPU, the int hash).
    const third = gpuHashes[1][0];
    expect(index.applyEvent(2, { type: 'removed', blockHashes: [third], medium: 'GPU', groupIdx: 0 })).toBe(true);
    const match = index.match(second);
    expect(match.matchedBlocks[0]).toBe(2);
    expect(match.weightedBlocks![0]).toBeCloseTo(2.8);
    // The first prompt's third block left both tiers: nothing past its GPU run.
    index.applyEvent(2, { type: 'removed', blockHashes: [gpuHashes[0][2]], medium: 'GPU', groupIdx: 0 });
    expect(index.match(Array.from({ length: 12 }, (_, i) => i + 1)).weightedBlocks?.[0] ?? 2).toBe(2);
  });
});
