import { describe, expect, it } from '@jest/globals';
import { PromptBlockHasher } from '../../lib/policies/prefix-aware-hasher';
import { hashPromptBlocks } from '../../lib/policies/prefix-aware-index';

/** A deterministic prompt of `length` UTF-16 code units drawn from `alphabet`. */
function prompt(length: number, seed: number, alphabet: readonly number[]): string {
  let state = seed >>> 0 || 1;
  const units: number[] = [];
  for (let i = 0; i < length; i++) {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    units.push(alphabet[(state >>> 0) % alphabet.length]);
  }
  return String.fromCharCode(...units);
}

const ASCII = Array.from({ length: 95 }, (_, i) => 32 + i);
// Two-byte text with lone surrogates and a 0 unit: every code unit must be hashed as it is.
const WIDE = [0, 0x41, 0xe9, 0x3b1, 0x4e2d, 0xd83d, 0xde00, 0xdfff, 0xfeff, 0xffff];

function reference(text: string, blockChars: number, maxBlocks: number): Int32Array {
  const count = Math.min(Math.floor(text.length / blockChars), maxBlocks);
  const out = new Int32Array(count);
  hashPromptBlocks(text, blockChars, count, out);
  return out;
}

describe('PromptBlockHasher', () => {
  it.each([
    ['ASCII, 64-character blocks', ASCII, 64],
    ['two-byte text and lone surrogates, 64-character blocks', WIDE, 64],
    ['4-character blocks', WIDE, 4],
    ['an odd block size (the per-character fallback)', WIDE, 7],
    ['an odd number of words per block', ASCII, 6],
  ])('gives hashPromptBlocks’s hashes: %s', (_name, alphabet, blockChars) => {
    const hasher = new PromptBlockHasher(blockChars, 1 << 20);
    // Growing and shrinking prompts: the buffers are reused, and a shorter prompt must not see a longer one's tail.
    for (const [length, seed] of [[10, 1], [4097, 2], [130, 3], [20_000, 4], [blockChars - 1, 5], [blockChars * 3 + 1, 6]]) {
      const text = prompt(length, seed, alphabet);
      const count = hasher.hash(text);
      expect(Array.from(hasher.hashes.subarray(0, count))).toEqual(Array.from(reference(text, blockChars, 1 << 20)));
    }
  });

  it('hashes at most maxBlocks blocks, and a rope as its flat string', () => {
    const hasher = new PromptBlockHasher(64, 10);
    const text = prompt(64 * 25, 9, ASCII);
    const rope = text.slice(0, 700) + text.slice(700);
    expect(hasher.hash(rope)).toBe(10);
    expect(Array.from(hasher.hashes.subarray(0, 10))).toEqual(Array.from(reference(text, 64, 10)));
  });
});
