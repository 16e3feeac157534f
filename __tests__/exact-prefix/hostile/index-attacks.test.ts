import { describe, expect, it } from '@jest/globals';
import type { EngineBlockHash, KvBlockStored, KvEvent } from '../../../lib/exact-prefix/events/decode';
import { KvExactIndex } from '../../../lib/exact-prefix/index/exact-index';
import { collidingIntegers } from './v8-collisions';

function stored(hashes: EngineBlockHash[], parent: EngineBlockHash | null, tokens: number[], more: Partial<KvBlockStored> = {}): KvEvent {
  return { type: 'stored', blockHashes: hashes, parentBlockHash: parent, tokenIds: tokens, blockSize: 1, loraId: null, loraName: null, medium: null, extraKeyed: null, groupIdx: null, ...more };
}

function timeStore(hashes: number[]): number {
  const index = new KvExactIndex({ ranks: [0] });
  const tokens = hashes.map((_, i) => i);
  const started = process.hrtime.bigint();
  index.applyEvent(0, stored(hashes, null, tokens));
  index.applyEvent(0, { type: 'removed', blockHashes: hashes, medium: null, groupIdx: null });
  return Number(process.hrtime.bigint() - started) / 1e6;
}

describe('KvExactIndex under a hostile publisher', () => {
  it('engine hashes chosen to collide in V8 Maps cost what ordinary ones do (item 22.2)', () => {
    const colliding = collidingIntegers(16_384);
    expect(colliding).toHaveLength(16_384);
    const ordinary = colliding.map((_, i) => i * 7919 + 1);
    timeStore(ordinary);
    const plain = timeStore(ordinary);
    const attacked = timeStore(colliding);
    // Unkeyed, the colliding batch took ~100× longer (about 1 s on a loaded machine).
    expect(attacked).toBeLessThan(plain * 4 + 200);
  });

  it('eviction at a full rank costs O(1) per block, not a walk from the head (item 22.6)', () => {
    const full = 60_000;
    const index = new KvExactIndex({ ranks: [0], maxBlocks: full });
    const fill = (from: number): number => {
      const hashes = Array.from({ length: full }, (_, i) => from + i);
      const started = process.hrtime.bigint();
      index.applyEvent(0, stored(hashes, null, hashes.map((h) => h % 1000)));
      return Number(process.hrtime.bigint() - started) / 1e6;
    };
    const filling = fill(1);
    const evicting = fill(1_000_000);
    expect(index.blockCount(0)).toBe(full);
    // Restarting at the Map's head per evicted block (skipping the holes the previous
    // evictions left) made this quadratic: 10× and more the filling time at this size.
    expect(evicting).toBeLessThan(filling * 4 + 100);
  });

  it("learns the block size from the followed group's GPU stores only, per rank (item 22.8)", () => {
    const index = new KvExactIndex({ ranks: [0, 1] });
    // CPU offload and a sliding-window group 1 with 64-token blocks come first.
    index.applyEvent(0, stored([1], null, Array(64).fill(5), { blockSize: 64, medium: 'CPU' }));
    index.applyEvent(0, stored([2], null, Array(64).fill(5), { blockSize: 64, groupIdx: 1, kvCacheSpecKind: 'sliding_window' }));
    // An empty store with an absurd size teaches nothing.
    index.applyEvent(1, stored([], null, [], { blockSize: 1_000_003 }));
    expect(index.applyEvent(0, stored([10, 11], null, [1, 2, 3, 4], { blockSize: 2 }))).toBe(true);
    expect(index.blockSize).toBe(2);
    // One rank's odd size does not turn the other ranks off.
    expect(index.applyEvent(1, stored([20], null, [1, 2, 3], { blockSize: 3 }))).toBe(true);
    expect(index.applyEvent(0, stored([12], 11, [5, 6], { blockSize: 2 }))).toBe(true);
    expect(index.blockSize).toBe(2);
    expect(Array.from(index.match([1, 2, 3, 4, 5, 6]).matchedBlocks)).toEqual([3, 0]);
    // A rank holding blocks keeps its size: a different one is refused.
    expect(index.applyEvent(0, stored([13], null, [1, 2, 3], { blockSize: 3 }))).toBe(false);
  });

  it('a colliding engine hash for a parent does not chain onto another block', () => {
    const index = new KvExactIndex({ ranks: [0] });
    index.applyEvent(0, stored([10], null, [1]));
    index.applyEvent(0, { type: 'removed', blockHashes: [10], medium: null, groupIdx: null });
    index.applyEvent(0, stored([11], 10, [2]));
    expect(index.blockCount(0)).toBe(0);
  });
});
