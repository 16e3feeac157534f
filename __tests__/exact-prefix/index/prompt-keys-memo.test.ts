import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import type { KvEvent } from '../../../lib/exact-prefix/events/decode';
import type { BlockKeys } from '../../../lib/exact-prefix/index/exact-index';
import { KvExactIndex } from '../../../lib/exact-prefix/index/exact-index';
import { PromptKeysMemo } from '../../../lib/exact-prefix/index/prompt-keys-memo';
import { IdParts, partsOf } from '../../../lib/exact-prefix/tokenizer/id-parts';

const stored = (hashes: number[], tokenIds: number[], blockSize: number, loraName: string | null = null): KvEvent => ({
  type: 'stored', blockHashes: hashes, parentBlockHash: null, tokenIds, blockSize, loraId: loraName === null ? null : 1, loraName, medium: null, extraKeyed: null, groupIdx: null,
});

const fresh = (): BlockKeys => ({ size: 0, loraName: undefined, values: [] });

describe('prompt keys memo', () => {
  it('gives the keys hashing gives, for prompts sharing prefixes or not, whatever the adapter', () => {
    // Prompts are a shared stem cut somewhere and given another tail, so that they share
    // prefixes of every length with the one before.
    const prompt = fc.record({ cut: fc.integer({ min: 0, max: 40 }), tail: fc.array(fc.integer({ min: 0, max: 3 }), { maxLength: 20 }), lora: fc.boolean() });
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 3 }), { minLength: 40, maxLength: 40 }), fc.array(prompt, { minLength: 1, maxLength: 12 }), (stem, prompts) => {
        const index = new KvExactIndex({ ranks: [0, 1] });
        index.applyEvent(1, stored([7], stem.slice(0, 4), 4));
        index.applyEvent(1, stored([8], stem.slice(0, 4), 4, 'adapter'));
        const memo = new PromptKeysMemo();
        // The stem as the tokenizer's cached pieces would give it: the same arrays every time.
        const pieces = Array.from({ length: 8 }, (_, at) => stem.slice(5 * at, 5 * at + 5));
        for (const [n, { cut, tail, lora }] of prompts.entries()) {
          const joined = new IdParts();
          for (let at = 0; at < Math.floor(cut / 5); at++) joined.add(pieces[at]);
          joined.add(stem.slice(5 * Math.floor(cut / 5), cut));
          joined.add(tail);
          const tokens = joined.join();
          expect(tokens).toEqual([...stem.slice(0, cut), ...tail]);
          const loraName = lora ? 'adapter' : undefined;
          // Every other prompt without its parts: the memo compares ids then.
          const keys = memo.keysFor(tokens, n % 2 === 0 ? partsOf(tokens) : undefined);
          const plain = fresh();
          expect(index.match(tokens, { now: 0, loraName, keys })).toEqual(index.match(tokens, { now: 0, loraName, keys: plain }));
          index.speculate(0, tokens, 1000, { loraName, keys });
          index.speculate(0, tokens, 1000, { loraName, keys: plain });
          expect(keys).toEqual(plain);
        }
      }),
      { numRuns: 300 },
    );
  });

  it('takes the same arrays at the same places for the same ids, without comparing them', () => {
    const index = new KvExactIndex({ ranks: [0] });
    index.applyEvent(0, stored([1], [9, 9, 9, 9], 4));
    const memo = new PromptKeysMemo();
    const piece = [1, 2, 3, 4];
    const first = memo.keysFor([1, 2, 3, 4, 5, 6, 7, 8], [piece, [5, 6, 7, 8]]);
    index.speculate(0, [1, 2, 3, 4, 5, 6, 7, 8], 1000, { keys: first });
    // A broken promise (the ids differ under the same array) shows the array is trusted; the
    // ids after it are compared.
    expect(memo.keysFor([0, 0, 0, 0, 5, 6, 7, 8], [piece, [5, 6, 7, 8]]).values).toEqual(first.values);
    // Other arrays are compared id by id: the last prompt's first block was four zeros.
    expect(memo.keysFor([1, 2, 3, 4, 5, 6, 7, 8], [[1, 2, 3, 4], [5, 6, 7, 8]]).values).toEqual([]);
  });

  it('takes up the last prompt keys as far as both share full blocks', () => {
    const index = new KvExactIndex({ ranks: [0] });
    index.applyEvent(0, stored([1], [9, 9, 9, 9], 4));
    const memo = new PromptKeysMemo();
    const first = memo.keysFor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    index.speculate(0, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 1000, { keys: first });
    expect(first.values).toHaveLength(2);
    // The second block differs at its last id: only the first block's key is taken up.
    const second = memo.keysFor([1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12]);
    expect(second.values).toEqual(first.values.slice(0, 1));
    index.speculate(0, [1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12], 1000, { keys: second });
    expect(second.values).toHaveLength(3);
    expect(second.values[1]).not.toBe(first.values[1]);
    // A shorter prompt takes up the blocks it has whole.
    expect(memo.keysFor([1, 2, 3, 4, 5, 6, 7, 0, 9]).values).toEqual(second.values.slice(0, 2));
  });
});
