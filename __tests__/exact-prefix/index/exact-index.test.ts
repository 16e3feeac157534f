import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { EngineBlockHash, KvBlockStored, KvEvent } from '../../../lib/exact-prefix/events/decode';
import { KvExactIndex } from '../../../lib/exact-prefix/index/exact-index';
import { randomHashKey } from '../../../lib/exact-prefix/index/keyed-hash';
import { decodeKvEventBatch } from '../../../lib/exact-prefix/events/decode';
import { RECORDINGS, payloadOf, vllmRecording, type VllmRecording } from '../vllm-recordings';

function stored(hashes: EngineBlockHash[], parent: EngineBlockHash | null, tokens: number[], more: Partial<KvBlockStored> = {}): KvEvent {
  return { type: 'stored', blockHashes: hashes, parentBlockHash: parent, tokenIds: tokens, blockSize: 2, loraId: null, loraName: null, medium: null, extraKeyed: null, groupIdx: null, ...more };
}

const prompt = [1, 2, 3, 4, 5, 6, 7];

describe('KvExactIndex', () => {
  it('counts the leading blocks each rank holds, chained over parents across events', () => {
    const index = new KvExactIndex({ ranks: [0, 1, 2] });
    expect(index.applyEvent(0, stored([10, 11], null, [1, 2, 3, 4]))).toBe(true);
    expect(index.applyEvent(0, stored([12], 11, [5, 6]))).toBe(true);
    index.applyEvent(1, stored([10], null, [1, 2]));
    // Rank 2 holds the second block's tokens under another first block: not a prefix match.
    index.applyEvent(2, stored([20, 21], null, [9, 9, 3, 4]));
    expect(Array.from(index.match(prompt).matchedBlocks)).toEqual([3, 1, 0]);
    expect(index.match(prompt)).toMatchObject({ blockSize: 2, promptBlocks: 3 });
    expect(index.blockCount(0)).toBe(3);
    expect(index.totalBlocks).toBe(6);
  });

  it('counts per rank the leading blocks it holds, stored or speculative, and keys the blocks as far as the longest match and one further', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 2 }), { minLength: 24, maxLength: 24 }),
        fc.array(fc.record({ stored: fc.integer({ min: 0, max: 12 }), speculated: fc.integer({ min: 0, max: 12 }) }), { minLength: 4, maxLength: 4 }),
        fc.integer({ min: 0, max: 24 }),
        fc.array(fc.integer({ min: 0, max: 2 }), { maxLength: 6 }),
        (stem, held, cut, tail) => {
          const index = new KvExactIndex({ ranks: [0, 1, 2, 3] });
          held.forEach(({ stored: blocks, speculated }, rank) => {
            // A block of another rank's first tokens, so that every rank knows the block size.
            index.applyEvent(rank, stored([1000 + rank], null, [7, 7]));
            if (blocks > 0) index.applyEvent(rank, stored(Array.from({ length: blocks }, (_, b) => rank * 100 + b), null, stem.slice(0, 2 * blocks)));
            if (speculated > 0) index.speculate(rank, stem.slice(0, 2 * speculated), 10);
          });
          const tokens = [...stem.slice(0, cut), ...tail];
          let same = 0;
          while (same < Math.min(tokens.length, stem.length) && tokens[same] === stem[same]) same++;
          const keys = { size: 0, loraName: undefined, values: [] as number[] };
          const { promptBlocks, matchedBlocks } = index.match(tokens, { now: 0, keys });
          expect(promptBlocks).toBe(Math.floor(tokens.length / 2));
          const expected = held.map(({ stored: blocks, speculated }) => Math.min(Math.max(blocks, speculated), Math.floor(same / 2)));
          expect([...matchedBlocks]).toEqual(expected);
          expect(keys.values).toHaveLength(Math.min(promptBlocks, Math.max(...expected) + 1));
          // Expired speculation counts no more.
          expect([...index.match(tokens, { now: 10 }).matchedBlocks]).toEqual(held.map(({ stored: blocks }) => Math.min(blocks, Math.floor(same / 2))));
        },
      ),
      { numRuns: 300 },
    );
  });

  it('keys do not depend on the engine hashes: another engine seed gives the same answer', () => {
    const a = new KvExactIndex({ ranks: [0] });
    const b = new KvExactIndex({ ranks: [0] });
    a.applyEvent(0, stored([1, 2], null, [1, 2, 3, 4]));
    b.applyEvent(0, stored([Buffer.alloc(32, 7).toString('latin1'), 99n], null, [1, 2, 3, 4]));
    expect(Array.from(a.match(prompt).matchedBlocks)).toEqual(Array.from(b.match(prompt).matchedBlocks));
  });

  it('removes by engine hash, and a removed middle block ends the match there', () => {
    const index = new KvExactIndex({ ranks: [0] });
    index.applyEvent(0, stored([10, 11, 12], null, [1, 2, 3, 4, 5, 6]));
    index.applyEvent(0, { type: 'removed', blockHashes: [11, 999], medium: null, groupIdx: null });
    expect(index.match(prompt).matchedBlocks[0]).toBe(1);
    expect(index.blockCount(0)).toBe(2);
  });

  it('AllBlocksCleared and clearRank forget one rank only', () => {
    const index = new KvExactIndex({ ranks: [0, 1] });
    index.applyEvent(0, stored([10], null, [1, 2]));
    index.applyEvent(1, stored([10], null, [1, 2]));
    index.applyEvent(0, { type: 'cleared' });
    expect(Array.from(index.match(prompt).matchedBlocks)).toEqual([0, 1]);
    index.clearRank(1);
    expect(index.totalBlocks).toBe(0);
  });

  it('routes on GPU blocks only: other media and unknown parents are skipped', () => {
    const index = new KvExactIndex({ ranks: [0] });
    index.applyEvent(0, stored([10], null, [1, 2], { medium: 'CPU' }));
    index.applyEvent(0, stored([12], 777, [3, 4]));
    expect(index.totalBlocks).toBe(0);
    index.applyEvent(0, stored([10], null, [1, 2], { medium: 'GPU' }));
    // A CPU eviction of the same hash leaves the GPU block alone.
    index.applyEvent(0, { type: 'removed', blockHashes: [10], medium: 'CPU', groupIdx: null });
    expect(index.match(prompt).matchedBlocks[0]).toBe(1);
  });

  it('does not index blocks hashed with extra keys, nor their descendants', () => {
    const index = new KvExactIndex({ ranks: [0] });
    index.applyEvent(0, stored([10, 11, 12], null, [1, 2, 3, 4, 5, 6], { extraKeyed: [false, true, false] }));
    expect(index.match(prompt).matchedBlocks[0]).toBe(1);
    expect(index.totalBlocks).toBe(1);
  });

  it('indexes LoRA blocks under the adapter name, apart from the base model', () => {
    const index = new KvExactIndex({ ranks: [0] });
    index.applyEvent(0, stored([10], null, [1, 2], { loraId: 1, loraName: 'sql' }));
    index.applyEvent(0, stored([11], null, [1, 2], { loraId: 2 })); // id without a name: unmatchable
    expect(index.match(prompt).matchedBlocks[0]).toBe(0);
    expect(index.match(prompt, { loraName: 'sql' }).matchedBlocks[0]).toBe(1);
    expect(index.match(prompt, { loraName: 'other' }).matchedBlocks[0]).toBe(0);
  });

  it('refuses a block size that differs from the first one, and an untracked rank', () => {
    const index = new KvExactIndex({ ranks: [0] });
    expect(index.applyEvent(0, stored([10], null, [1, 2]))).toBe(true);
    expect(index.applyEvent(0, stored([11], null, [1, 2, 3], { blockSize: 3 }))).toBe(false);
    expect(index.applyEvent(5, stored([10], null, [1, 2]))).toBe(false);
  });

  it('stays within maxBlocks, keeping blocks a lookup used over ones it did not', () => {
    const index = new KvExactIndex({ ranks: [0], maxBlocks: 4 });
    for (let i = 0; i < 4; i++) index.applyEvent(0, stored([i], null, [100 + i, 0]));
    expect(index.match([100, 0]).matchedBlocks[0]).toBe(1); // block 0 is used
    index.applyEvent(0, stored([4], null, [104, 0]));
    expect(index.totalBlocks).toBe(4);
    expect(index.match([100, 0]).matchedBlocks[0]).toBe(1);
    expect(index.match([101, 0]).matchedBlocks[0]).toBe(0); // the oldest unused went
    for (let i = 5; i < 100; i++) index.applyEvent(0, stored([i], null, [100 + i, 0]));
    expect(index.totalBlocks).toBe(4);
    expect(index.blockCount(0)).toBe(4);
  });

  it('a store of a known engine hash with other content replaces the old key', () => {
    const index = new KvExactIndex({ ranks: [0], hashKey: randomHashKey() });
    index.applyEvent(0, stored([10], null, [1, 2]));
    index.applyEvent(0, stored([10], null, [3, 4]));
    expect(index.totalBlocks).toBe(1);
    expect(index.match([1, 2]).matchedBlocks[0]).toBe(0);
    expect(index.match([3, 4]).matchedBlocks[0]).toBe(1);
  });

  it('answers zeros before any block size is known, and for prompts shorter than a block', () => {
    const index = new KvExactIndex({ ranks: [0] });
    expect(index.match(prompt)).toEqual({ blockSize: 0, promptBlocks: 0, matchedBlocks: new Int32Array(1) });
    index.applyEvent(0, stored([10], null, [1, 2]));
    expect(index.match([1]).promptBlocks).toBe(0);
  });
  describe('speculative entries', () => {
    it("count a routed prompt's blocks on its rank until they expire", () => {
      const index = new KvExactIndex({ ranks: [0, 1] });
      index.applyEvent(0, stored([10], null, [1, 2]));
      index.speculate(1, prompt, 1000);
      expect(Array.from(index.match(prompt, { now: 999 }).matchedBlocks)).toEqual([1, 3]);
      expect(index.speculativeBlocks).toBe(3);
      expect(Array.from(index.match(prompt, { now: 1000 }).matchedBlocks)).toEqual([1, 0]);
      expect(index.speculativeBlocks).toBe(0);
      expect(index.totalBlocks).toBe(1);
    });

    it('are confirmed (and so dropped) by the stored event of the same block, and cleared with the rank', () => {
      const index = new KvExactIndex({ ranks: [0] });
      index.applyEvent(0, stored([10], null, [9, 9]));
      index.speculate(0, prompt, Infinity);
      expect(index.speculativeBlocks).toBe(3);
      index.applyEvent(0, stored([20, 21], null, [1, 2, 3, 4]));
      expect(index.speculativeBlocks).toBe(1);
      expect(index.match(prompt).matchedBlocks[0]).toBe(3);
      index.clearRank(0);
      expect(index.speculativeBlocks).toBe(0);
      expect(index.match(prompt).matchedBlocks[0]).toBe(0);
    });

    it('are bounded per rank, the oldest dropped first', () => {
      const index = new KvExactIndex({ ranks: [0], maxSpeculativeBlocks: 2 });
      index.applyEvent(0, stored([10], null, [9, 9]));
      index.speculate(0, prompt, Infinity);
      expect(index.speculativeBlocks).toBe(2);
      // The first block went first: the chain no longer matches from the start.
      expect(index.match(prompt).matchedBlocks[0]).toBe(0);
    });

    it('need the block size: nothing is speculated before the first stored event', () => {
      const index = new KvExactIndex({ ranks: [0] });
      index.speculate(0, prompt, Infinity);
      expect(index.speculativeBlocks).toBe(0);
    });
  });
});

/** Applies the first `count` messages of a recording of vLLM 52a31cc (fixtures/vllm-52a31cc), decoded by the router's decoder, to its rank. */
function apply(index: KvExactIndex, recording: VllmRecording, count = recording.frames.length, change: (event: KvEvent) => KvEvent = (event) => event): void {
  for (let at = 0; at < count; at++) {
    const decoded = decodeKvEventBatch(payloadOf(recording, at));
    if (!decoded.ok) throw new Error(`${recording.name} message ${at}: ${decoded.reason}`);
    for (const event of decoded.batch.events) expect(index.applyEvent(recording.dataParallelRank, change(event))).toBe(true);
  }
}

/** An index of the recording's rank fed every one of its events. */
function fedWith(name: (typeof RECORDINGS)[number], change?: (event: KvEvent) => KvEvent): KvExactIndex {
  const recording = vllmRecording(name);
  const index = new KvExactIndex({ ranks: [recording.dataParallelRank] });
  apply(index, recording, undefined, change);
  return index;
}

const upTo = (last: number, first = 1) => Array.from({ length: last - first + 1 }, (_, i) => first + i);

describe('KvExactIndex on vLLM 52a31cc events', () => {
  it("indexes a LoRA request's blocks under its adapter: a request naming it matches, the base model and a salted prompt do not", () => {
    const index = fedWith('lora');
    // Prompt 1..9 under sql-lora, salted under sql-lora, salted without adapter (README).
    expect(index.match(upTo(9), { loraName: 'sql-lora' }).matchedBlocks[0]).toBe(2);
    expect(index.match(upTo(9)).matchedBlocks[0]).toBe(0);
    expect(index.match(upTo(9), { loraName: 'other-lora' }).matchedBlocks[0]).toBe(0);
    expect(index.isAdapter('sql-lora')).toBe(true);
    // The salted prompts are keyed under their salt, as vLLM keys their first block.
    expect(index.match(upTo(9), { loraName: 'sql-lora', salt: 'tenant-a' }).matchedBlocks[0]).toBe(2);
    expect(index.match(upTo(9), { salt: 'tenant-a' }).matchedBlocks[0]).toBe(2);
    expect(index.match(upTo(9), { salt: 'tenant-b' }).matchedBlocks[0]).toBe(0);
  });

  it("keys a salted prompt's blocks under its cache_salt: a request with that salt finds them as vLLM does, another salt or none does not", () => {
    const recording = vllmRecording('salt');
    const cached = (recording as unknown as { cachedTokens: Record<string, number> }).cachedTokens;
    const decoded = decodeKvEventBatch(payloadOf(recording, 0));
    if (!decoded.ok) throw new Error(decoded.reason);
    const [a, b, c, d] = decoded.batch.events;
    const index = new KvExactIndex({ ranks: [2] });
    const rank = recording.dataParallelRank;
    const second = [...upTo(8), ...upTo(24, 20)];
    // Before each store, the index predicts what vLLM's get_computed_blocks found (README: cachedTokens).
    expect(index.applyEvent(rank, a)).toBe(true);
    expect(index.match(second, { salt: 'tenant-a' }).matchedBlocks[0] * 4).toBe(cached.b);
    expect(index.match(upTo(9), { salt: 'tenant-b' }).matchedBlocks[0] * 4).toBe(cached.c);
    expect(index.match(upTo(9)).matchedBlocks[0] * 4).toBe(cached.d);
    for (const event of [b, c, d]) expect(index.applyEvent(rank, event)).toBe(true);
    expect(index.match(second, { salt: 'tenant-a' }).matchedBlocks[0]).toBe(3);
    expect(index.match(second, { salt: 'tenant-b' }).matchedBlocks[0]).toBe(2);
    expect(index.match(second).matchedBlocks[0]).toBe(2);
    expect(index.match(upTo(9), { salt: 'tenant-c' }).matchedBlocks[0]).toBe(0);
    expect(index.blockCount(rank)).toBe(7);
  });

  it("follows the full-attention group of a hybrid model: a sliding-window group's evictions do not hide a prefix the engine still holds", () => {
    // Group 0 (sliding window) removes blocks 0..2 of prompt 1..17; group 1 (full attention) keeps all four.
    const index = fedWith('hybrid-window');
    expect(index.match(upTo(17)).matchedBlocks[0]).toBe(4);
    expect(index.match(upTo(68, 60)).matchedBlocks[0]).toBe(2);
    expect(index.blockCount(2)).toBe(6);
  });

  it('follows the group of highest index when the events name no kind (vLLM between #37688 and #40984)', () => {
    const index = fedWith('hybrid-window', (event) => (event.type === 'stored' ? { ...event, kvCacheSpecKind: null } : event));
    expect(index.match(upTo(17)).matchedBlocks[0]).toBe(4);
  });

  it("reads a hybrid model with two block sizes on its full-attention group's size, the masked sliding-window store skipped", () => {
    const index = fedWith('hybrid-masked');
    expect(index.match(upTo(17))).toMatchObject({ blockSize: 8, promptBlocks: 2 });
    expect(index.match(upTo(17)).matchedBlocks[0]).toBe(2);
  });

  it("applies a hybrid model's removals to the followed group", () => {
    const index = fedWith('hybrid-evict');
    expect(index.match(upTo(9)).matchedBlocks[0]).toBe(0);
    expect(index.match(upTo(58, 50)).matchedBlocks[0]).toBe(2);
    expect(index.blockCount(2)).toBe(2);
  });

  it("leaves an offloading connector's CPU blocks out, its removals touching no GPU block", () => {
    const index = fedWith('offload');
    expect(index.match(upTo(9)).matchedBlocks[0]).toBe(2);
    expect(index.blockCount(2)).toBe(2);
  });

  it('follows removals and a reset of one full-attention group', () => {
    const index = new KvExactIndex({ ranks: [2] });
    const recording = vllmRecording('plain');
    const after = (count: number) => apply(index, recording, count);
    after(2);
    expect(index.match([...upTo(8), ...upTo(28, 20)]).matchedBlocks[0]).toBe(4);
    index.clearRank(2);
    after(3);
    expect(index.match(upTo(120, 100)).matchedBlocks[0]).toBe(5);
    expect(index.match(upTo(8)).matchedBlocks[0]).toBe(0);
    index.clearRank(2);
    after(4);
    expect(index.blockCount(2)).toBe(0);
  });
});

describe('KvExactIndex memory', () => {
  it('holds a block in the same heap whatever the size of the engine hashes (item 22.15)', () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const BLOCKS = 12_000;
    const perBlock = (hash: (n: number) => EngineBlockHash): number => {
      gc();
      const before = process.memoryUsage().heapUsed;
      const index = new KvExactIndex({ ranks: [0], maxBlocks: 2 * BLOCKS });
      // Events built and dropped one at a time: what stays is the index and what it keeps.
      for (let e = 0; e < BLOCKS / 100; e++) {
        const hashes = Array.from({ length: 100 }, (_, b) => hash(e * 100 + b + 1));
        index.applyEvent(0, stored(hashes, null, Array.from({ length: 200 }, (_, t) => (e * 7 + t) % 50_000)));
      }
      gc();
      const bytes = (process.memoryUsage().heapUsed - before) / BLOCKS;
      expect(index.totalBlocks).toBe(BLOCKS);
      return bytes;
    };
    // vLLM's SHA-256 based hashes can be 64 bytes; kept as strings they cost 193 B a block
    // against 147 for integer hashes. Keyed to numbers, the size does not matter.
    const long = perBlock((n) => Buffer.alloc(64, n % 251).toString('latin1') + String(n));
    const short = perBlock((n) => n * 2_654_435_761);
    expect(long / short).toBeLessThan(1.12);
  });
});

