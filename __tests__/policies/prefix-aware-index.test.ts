import { describe, expect, it } from '@jest/globals';
import { keyedMix32 } from '../../lib/hash';
import { BlockIndex, MAX_PROBES } from '../../lib/policies/prefix-aware-index';

/** A small deterministic generator (an LCG), so that a failure replays. */
function generator(seed: number): (below: number) => number {
  let state = seed >>> 0;
  return (below) => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state % below;
  };
}

/**
 * Chains as prompts make them, without hash collisions: every block is a fresh id, and a chain
 * that shares another's first blocks shares their ids (a conversation's next turn, a second
 * question after the same system prompt).
 */
function chains(seed: number, count: number, longest: number): Int32Array[] {
  const next = generator(seed);
  const made: Int32Array[] = [];
  let id = 1;
  for (let c = 0; c < count; c++) {
    const length = 1 + next(longest);
    const chain = new Int32Array(length);
    let shared = 0;
    if (made.length > 0 && next(10) < 7) {
      const base = made[next(made.length)];
      shared = Math.min(length, 1 + next(base.length));
      chain.set(base.subarray(0, shared));
    }
    for (let i = shared; i < length; i++) chain[i] = id++;
    made.push(chain);
  }
  return made;
}

/** Whether both indexes hold the same of the given hashes. */
function sameHeld(a: BlockIndex, b: BlockIndex, hashes: Iterable<number>): boolean {
  for (const hash of hashes) if (a.has(hash) !== b.has(hash)) return false;
  return true;
}

describe('BlockIndex.recordChain', () => {
  it('stops at the first block from the end that the current generation holds', () => {
    const index = new BlockIndex(1000);
    expect(index.recordChain(Int32Array.of(1, 2, 3), 3)).toBe(3);
    // Not a chain (3 follows other blocks here): only a chain's blocks before a held one are known held.
    expect(index.recordChain(Int32Array.of(5, 6, 3), 3)).toBe(0);
    expect(index.has(5)).toBe(false);
    expect(index.recordChain(Int32Array.of(1, 2, 3, 4), 4)).toBe(1);
    expect(index.leadingRun(Int32Array.of(1, 2, 3, 4), 4, 0)).toBe(4);
  });

  it('leaves an index of chains as record does, across generations turning over mid-chain', () => {
    const key = 0x2468ace;
    for (const maxBlocks of [16, 64, 300]) {
      const recorded = new BlockIndex(maxBlocks, key);
      const chained = new BlockIndex(maxBlocks, key);
      const all = chains(maxBlocks, 1500, 40);
      const seen = new Set<number>();
      let turnovers = 0;
      for (const [at, chain] of all.entries()) {
        const before = recorded.size;
        expect(chained.recordChain(chain, chain.length)).toBe(recorded.record(chain, chain.length));
        if (recorded.size < before) turnovers++;
        expect(chained.size).toBe(recorded.size);
        for (const hash of chain) seen.add(hash);
        if (at % 100 === 0) expect(sameHeld(recorded, chained, seen)).toBe(true);
        for (const earlier of all.slice(Math.max(0, at - 5), at + 1)) {
          expect(chained.leadingRun(earlier, earlier.length, 0)).toBe(recorded.leadingRun(earlier, earlier.length, 0));
        }
      }
      expect(sameHeld(recorded, chained, seen)).toBe(true);
      expect(turnovers).toBeGreaterThan(10);
    }
  });

  it('finds the same leading run from any guess (the steered search starts from the previous holder’s run)', () => {
    const key = 0x7531;
    const index = new BlockIndex(300, key);
    const all = chains(11, 600, 40);
    let guessed = 0;
    for (const [at, chain] of all.entries()) {
      index.recordChain(chain, chain.length);
      if (at % 7 !== 0) continue;
      // Earlier chains, some partly evicted: the run is the count of leading blocks held, one by one.
      for (const earlier of all.slice(Math.max(0, at - 40), at + 1)) {
        let held = 0;
        while (held < earlier.length && index.has(earlier[held])) held++;
        for (let guess = 0; guess <= earlier.length + 1; guess++) {
          expect(index.leadingRun(earlier, earlier.length, 0, undefined, guess)).toBe(held);
          // With a run to beat, 0 when the run falls short of it, as without a guess.
          const toBeat = 1 + (guess % earlier.length);
          expect(index.leadingRun(earlier, earlier.length, toBeat, undefined, guess)).toBe(index.leadingRun(earlier, earlier.length, toBeat));
          guessed++;
        }
      }
    }
    expect(guessed).toBeGreaterThan(10_000);
  });

  it('leaves an index as record does when a probe run is full and blocks cannot be added', () => {
    const key = 0x1234567;
    const maxBlocks = 256;
    const mask = BlockIndex.maskFor(maxBlocks);
    // Ids whose home slot is the same: a run of MAX_PROBES slots takes the first of them, no more.
    const colliding: number[] = [];
    for (let id = 1; colliding.length < 100; id++) if ((keyedMix32(id, key) & mask) === 7) colliding.push(id);
    const head = Int32Array.from(colliding);
    const longer = Int32Array.from([...colliding.slice(0, 80), 1_000_001, 1_000_002]);
    const recorded = new BlockIndex(maxBlocks, key);
    const chained = new BlockIndex(maxBlocks, key);
    for (const [at, chain] of [head, head, longer, head, longer].entries()) {
      expect(chained.recordChain(chain, chain.length)).toBe(recorded.record(chain, chain.length));
      expect(sameHeld(recorded, chained, [...colliding, 1_000_001, 1_000_002])).toBe(true);
      if (at === 1) expect(colliding.filter((id) => chained.has(id))).toHaveLength(MAX_PROBES);
    }
  });
});
