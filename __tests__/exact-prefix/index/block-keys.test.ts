import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import type { KvEvent } from '../../../lib/exact-prefix/events/decode';
import type { BlockKeys } from '../../../lib/exact-prefix/index/exact-index';
import { KvExactIndex } from '../../../lib/exact-prefix/index/exact-index';

const stored = (hashes: number[], parent: number | null, tokenIds: number[], blockSize: number): KvEvent => ({
  type: 'stored', blockHashes: hashes, parentBlockHash: parent, tokenIds, blockSize, loraId: null, loraName: null, medium: null, extraKeyed: null, groupIdx: null,
});

describe('block keys shared by match() and speculate()', () => {
  it('give what hashing again gives, and are computed once for both', () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 50 }), { minLength: 0, maxLength: 120 }), fc.integer({ min: 0, max: 7 }), (tokens, held) => {
        const make = () => {
          const index = new KvExactIndex({ ranks: [0, 1] });
          // Rank 1 holds the prompt's first `held` blocks of 4 tokens.
          const blocks = Math.min(held, Math.floor(tokens.length / 4));
          index.applyEvent(1, stored(Array.from({ length: Math.max(1, blocks) }, (_, b) => 100 + b), null, blocks === 0 ? [9, 9, 9, 9] : tokens.slice(0, blocks * 4), 4));
          return index;
        };
        const shared = make();
        const plain = make();
        const keys: BlockKeys = { size: 0, loraName: undefined, values: [] };
        const a = shared.match(tokens, { now: 0, keys });
        expect(a).toEqual(plain.match(tokens, { now: 0 }));
        // match() stops hashing where no rank holds the block; speculate() goes on from there.
        expect(keys.values.length).toBeLessThanOrEqual(Math.floor(tokens.length / 4));
        shared.speculate(0, tokens, 1000, { keys });
        plain.speculate(0, tokens, 1000);
        expect(keys.values).toHaveLength(Math.floor(tokens.length / 4));
        expect(shared.match(tokens, { now: 1 })).toEqual(plain.match(tokens, { now: 1 }));
        // Keys of another adapter are not taken for the base model's.
        const lora: BlockKeys = { size: 4, loraName: 'adapter', values: [...keys.values] };
        shared.speculate(1, tokens, 1000, { keys: lora });
        plain.speculate(1, tokens, 1000);
        expect(lora.loraName).toBeUndefined();
        expect(shared.match(tokens, { now: 2 })).toEqual(plain.match(tokens, { now: 2 }));
      }),
      { numRuns: 100 },
    );
  });
});
