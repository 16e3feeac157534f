import { describe, expect, it } from '@jest/globals';
import { chainHash, halfSipHash53, processHashKey, randomHashKey, type HashKey } from '../../../lib/exact-prefix/index/keyed-hash';

// The reference implementation's (veorq/SipHash halfsiphash.c) 64-bit output built with
// cROUNDS=1 and dROUNDS=3 (the same build with 2 and 4 gives its published vectors_hsip64):
// key bytes 00..07, message bytes 00..n-1; the first four output bytes are the low word,
// little-endian. 76 bytes is a 16-token block's link.
const KEY: HashKey = [0x03020100, 0x07060504];
const words = (n: number): number[] => Array.from({ length: n / 4 }, (_, w) => ((4 * w + 3) << 24 | (4 * w + 2) << 16 | (4 * w + 1) << 8 | (4 * w)) >>> 0);
function truncated(hex: string): number {
  const bytes = Buffer.from(hex, 'hex');
  return (bytes.readUInt32LE(4) & 0x1fffff) * 2 ** 32 + bytes.readUInt32LE(0);
}

describe('keyed hash', () => {
  it.each([
    [12, '5577cc5cb3e73f93'],
    [16, '56d7c5b93d3e2ec2'],
    [20, '525e23294d7408e4'],
    [32, '166eee0fc184b8f1'],
    [76, 'd65ae915c2499daa'],
  ])('matches HalfSipHash-1-3-64 of the reference implementation, %i bytes', (length, hex) => {
    const message = words(length);
    expect(halfSipHash53(KEY, message[0], message[1], message[2], message, 3, message.length - 3)).toBe(truncated(hex));
  });

  it('depends on the key, the chain and every word', () => {
    const tokens = [1, 2, 3, 4];
    const base = chainHash(KEY, 3, 12345, tokens, 0, 4);
    expect(chainHash(randomHashKey(), 3, 12345, tokens, 0, 4)).not.toBe(base);
    expect(chainHash(KEY, 3, 12346, tokens, 0, 4)).not.toBe(base);
    expect(chainHash(KEY, 3, 12345, [1, 2, 3, 5], 0, 4)).not.toBe(base);
    expect(Number.isSafeInteger(base)).toBe(true);
  });

  it('draws one key per process', () => {
    expect(processHashKey()).toBe(processHashKey());
  });
});
