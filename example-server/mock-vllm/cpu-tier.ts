import type { MockKvEvent } from './kv-events';

/**
 * One rank's CPU tier, as vLLM 52a31cc's OffloadingConnector with its `CPUOffloadingManager`
 * keeps it: write-through, every full block a request computes is stored (the connector's
 * `_build_store_jobs` offers each scheduled request's new full blocks, and `prepare_store`
 * keeps the ones not held yet: offloading/scheduler.py:650-760, kv_offload/cpu/manager.py:139-194),
 * in an LRU (kv_offload/cpu/policies/lru.py) that never evicts a block of the request being
 * stored (manager.py:160-163). So the tier holds what the GPU pool evicted as long as the tier
 * is larger; a prompt whose leading blocks are on CPU only loads them (the connector's
 * `get_num_new_matched_tokens`, offloading/scheduler.py:498-541) instead of recomputing them.
 *
 * Events are those of `OffloadingConnectorScheduler.take_events` (offloading/scheduler.py:946-965):
 * one `BlockRemoved` of medium `CPU` per batch of evicted blocks, one `BlockStored` of medium
 * `CPU` per batch stored, no parent, no token ids, `block_size` 0, each block named by the
 * engine's 32-byte hash as it is (bytes), not converted to the 64-bit int the block pool's events
 * carry (kv_cache_utils.py:77-80): fixtures/vllm-52a31cc/offload-cpu.json shows both. The mock's
 * hashes are 53-bit numbers; their 32 bytes end with the number's 8 big-endian bytes, so that
 * their low 64 bits are the GPU events' int, as vLLM's are. (Newer vLLM converts them and sends
 * one event per block: engine-events.ts writes that form with the layouts of map events,
 * `array-batch` being newer vLLM's own.)
 */
export class CpuTier {
  /** Map insertion order is the LRU order: oldest first. */
  private readonly blocks = new Map<number, true>();

  constructor(private readonly capacityBlocks: number) {}

  /** Blocks held now. */
  get usedBlocks(): number {
    return this.blocks.size;
  }

  has(hash: number): boolean {
    return this.blocks.has(hash);
  }

  /** Marks the blocks a request looked up or loaded as recently used (the connector's `_touch`). */
  touch(hashes: readonly number[]): void {
    for (const hash of hashes) {
      if (!this.blocks.has(hash)) continue;
      this.blocks.delete(hash);
      this.blocks.set(hash, true);
    }
  }

  /** Stores the request's blocks not held yet, evicting the least recently used others first; its events. */
  store(hashes: readonly number[]): MockKvEvent[] {
    const toStore = hashes.filter((hash) => !this.blocks.has(hash));
    this.touch(hashes);
    if (toStore.length === 0) return [];
    const protectedHashes = new Set(hashes);
    const evictable = this.blocks.size - hashes.filter((hash) => this.blocks.has(hash)).length;
    const toEvict = toStore.length - (this.capacityBlocks - this.blocks.size);
    // vLLM stores nothing when the tier cannot make room (manager.py:163-165: "cannot store blocks").
    if (toEvict > evictable) return [];
    const events: MockKvEvent[] = [];
    if (toEvict > 0) {
      const evicted: number[] = [];
      for (const hash of this.blocks.keys()) {
        if (evicted.length === toEvict) break;
        if (!protectedHashes.has(hash)) evicted.push(hash);
      }
      for (const hash of evicted) this.blocks.delete(hash);
      events.push({ type: 'BlockRemoved', blockHashes: evicted.map(engineHashBytes), medium: 'CPU', groupIdx: null });
    }
    for (const hash of toStore) this.blocks.set(hash, true);
    events.push({ type: 'BlockStored', blockHashes: toStore.map(engineHashBytes), parentBlockHash: null, tokenIds: [], blockSize: 0, loraId: null, medium: 'CPU', loraName: null });
    return events;
  }
}

/** The 32 bytes of an engine block hash whose low 64 bits are `hash` (the rest: the same bytes inverted, thrice). */
export function engineHashBytes(hash: number): Uint8Array {
  const bytes = Buffer.alloc(32);
  bytes.writeBigUInt64BE(BigInt(hash), 24);
  for (let at = 0; at < 24; at++) bytes[at] = ~bytes[24 + (at % 8)] & 0xff;
  return bytes;
}

/** The int newer vLLM publishes for a hash `engineHashBytes` wrote: its low 64 bits (kv_cache_utils.py `maybe_convert_block_hash`). */
export function lowBits(hash: Uint8Array): number | bigint {
  const value = Buffer.from(hash).readBigUInt64BE(hash.length - 8);
  return value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value;
}
