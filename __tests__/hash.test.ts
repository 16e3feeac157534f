import { describe, expect, it } from '@jest/globals';
import { hashString, keyedMix32 } from '../lib/hash';
import { BlockIndex, hashPromptBlocks, MAX_PROBES, prefixAware } from '../lib/policies/prefix-aware';
import type { PickContext } from '../lib/types';
import { fakeEndpoints } from './policies/fake-endpoints';

const BLOCK = 64;
/** BlockIndex(256) keeps generations of 512 slots: small, so that forging is quick. */
const MAX_BLOCKS = 256;
const MASK = 2 * MAX_BLOCKS - 1;

/**
 * What a client can do against a public slot function: pick each 64-character block, by brute
 * force over a counter, so that the chained block hash lands in `target`'s slot. Returns the
 * prompt and its chain hashes.
 */
function forge(blocks: number, slotOf: (hash: number) => number, target = 7): { prompt: string; hashes: Int32Array } {
  const hashes = new Int32Array(blocks);
  const seen = new Set<number>();
  let prompt = '';
  let previous = 0;
  let counter = 0;
  for (let i = 0; i < blocks; i++) {
    for (;;) {
      const block = `user turn ${counter++} `.padEnd(BLOCK, 'x');
      const hash = hashString(block, previous);
      if (hash === 0 || seen.has(hash) || slotOf(hash) !== target) continue;
      seen.add(hash);
      hashes[i] = hash;
      previous = hash;
      prompt += block;
      break;
    }
  }
  return { prompt, hashes };
}

/** The index as it was: linear probing from the unkeyed slot `hash & mask`, without a bound. */
function unkeyedProbes(hashes: Int32Array): number {
  const slots = new Int32Array(MASK + 1);
  let probes = 0;
  for (const hash of hashes) {
    let slot = hash & MASK;
    while (slots[slot] !== 0 && slots[slot] !== hash) {
      probes++;
      slot = (slot + 1) & MASK;
    }
    slots[slot] = hash;
  }
  return probes;
}

describe('hash flooding of the prefix index', () => {
  it('forged blocks that collide in the public slot function cost no more than random ones', () => {
    const blocks = 200;
    const { prompt, hashes } = forge(blocks, (hash) => hash & MASK);
    // The forged prompt hashes as the policy hashes it.
    const again = new Int32Array(blocks);
    hashPromptBlocks(prompt, BLOCK, blocks, again);
    expect(again).toEqual(hashes);
    // Against the old slot function every block probes past all before it: quadratic.
    expect(unkeyedProbes(hashes)).toBe((blocks * (blocks - 1)) / 2);

    const index = new BlockIndex(MAX_BLOCKS);
    index.record(hashes, blocks);
    expect(index.leadingRun(hashes, blocks, 0)).toBe(blocks);
    for (const hash of hashes) expect(index.has(hash)).toBe(true);
    // Three operations per block (two in record, one lookup), plus the binary search. With a
    // random slot key the forged hashes scatter: about one extra probe per ten operations at
    // this load; 4 per block is far above chance and far below the quadratic 100 per block.
    expect(index.extraProbes).toBeLessThan(4 * blocks);
  });

  it('bounds the probes of any operation even against a client that knew the slot key', () => {
    const key = 0x1234567;
    const blocks = 150;
    const { hashes } = forge(blocks, (hash) => keyedMix32(hash === 0 ? 1 : hash, key) & MASK);
    const index = new BlockIndex(MAX_BLOCKS, key);
    const added = index.record(hashes, blocks);
    // One run of MAX_PROBES slots holds what fits; the rest is forgotten, not searched for.
    expect(added).toBe(MAX_PROBES);
    const operations = 2 * blocks + blocks;
    for (const hash of hashes) index.has(hash);
    expect(index.extraProbes).toBeLessThanOrEqual(operations * (MAX_PROBES - 1));
  });

  it('hashes, looks up and records at most maxBlocksPerRequest blocks of a prompt', () => {
    const candidates = fakeEndpoints(2);
    const ctx = (prompt: string): PickContext => ({ path: '/v1/completions', affinityKey: undefined, prompt });
    const head = 'shared head '.padEnd(BLOCK, '.').repeat(100);
    const tail = (seed: string) => `${seed} `.padEnd(BLOCK, '-').repeat(100);
    // Past the cap the tails are not there: the second prompt is a full hit on the first's
    // endpoint, worth more than a little load; without the cap it would be a half hit.
    const capped = prefixAware({ maxBlocksPerRequest: 100, contentBalance: 0 });
    const home = capped.pick(candidates, ctx(head + tail('one')));
    candidates[home.rank].load = 0.9;
    expect(capped.pick(candidates, ctx(head + tail('two'))).rank).toBe(home.rank);

    candidates[home.rank].load = 0;
    const whole = prefixAware({ contentBalance: 0 });
    const first = whole.pick(candidates, ctx(head + tail('one')));
    candidates[first.rank].load = 0.9;
    expect(whole.pick(candidates, ctx(head + tail('two'))).rank).not.toBe(first.rank);
    expect(() => prefixAware({ maxBlocksPerRequest: 0 })).toThrow(/maxBlocksPerRequest/);
  });
});
