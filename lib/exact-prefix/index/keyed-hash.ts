/**
 * HalfSipHash-1-3 with a 64-bit output (Aumasson and Bernstein's SipHash family on 32-bit
 * words), truncated to a 53-bit safe integer for use as a Map key. It is keyed so that
 * nobody who does not know the key can craft two token sequences whose router keys collide
 * (a forged collision would make the index claim a prefix a rank does not hold), nor engine
 * hashes that crowd one Map bucket. The key is random per process: router keys never leave the
 * process that computed them, so no output is ever shown to whoever sends the input. 1-3 rather
 * than 2-4 rounds: what Linux's hsiphash and Rust's HashMap use against hash flooding, and the
 * hash of every prompt block is most of what exact routing costs per request (26 rounds a
 * 16-token block rather than 48).
 */
import { randomBytes } from 'node:crypto';

/** A 64-bit key as two 32-bit words. */
export type HashKey = readonly [number, number];

/** A fresh random key. */
export function randomHashKey(): HashKey {
  const bytes = randomBytes(8);
  return [bytes.readUInt32LE(0), bytes.readUInt32LE(4)];
}

let processKey: HashKey | undefined;

/** The process's key, drawn on first use. */
export function processHashKey(): HashKey {
  processKey ??= randomHashKey();
  return processKey;
}

const TWO_POW_32 = 0x1_0000_0000;

// Bound once: a global read in the hash's callers costs 40× more in jest's vm context.
const floor = Math.floor;

/**
 * The keyed hash of `[domain, hi(chain), lo(chain), words[start, start + count)]`: one link
 * of a chain, where `chain` is the previous link's result (a 53-bit integer).
 */
export function chainHash(key: HashKey, domain: number, chain: number, words: ArrayLike<number>, start: number, count: number): number {
  return halfSipHash53(key, domain, floor(chain / TWO_POW_32), chain >>> 0, words, start, count);
}

/**
 * HalfSipHash-1-3-64 of the little-endian 32-bit words `[w0, w1, w2, words[start, start +
 * count)]`, its high word cut to 21 bits.
 */
export function halfSipHash53(key: HashKey, w0: number, w1: number, w2: number, words: ArrayLike<number>, start: number, count: number): number {
  // SipRound is written out where it runs on purpose: the state in locals, with no shared
  // round function, makes match() 2.7× faster (bench/kv-events.ts: 81 against 219 µs for an
  // 8k-token prompt); the three leading words are taken before the loop, so that a token id
  // costs one round and no test of where it is.
  const k0 = key[0] | 0;
  const k1 = key[1] | 0;
  let v0 = k0;
  let v1 = k1 ^ 0xee;
  let v2 = 0x6c796765 ^ k0;
  let v3 = 0x74656462 ^ k1;
  let m = w0 | 0;
  v3 ^= m;
  v0 = (v0 + v1) | 0; v1 = (v1 << 5) | (v1 >>> 27); v1 ^= v0; v0 = (v0 << 16) | (v0 >>> 16);
  v2 = (v2 + v3) | 0; v3 = (v3 << 8) | (v3 >>> 24); v3 ^= v2;
  v0 = (v0 + v3) | 0; v3 = (v3 << 7) | (v3 >>> 25); v3 ^= v0;
  v2 = (v2 + v1) | 0; v1 = (v1 << 13) | (v1 >>> 19); v1 ^= v2; v2 = (v2 << 16) | (v2 >>> 16);
  v0 ^= m;
  m = w1 | 0;
  v3 ^= m;
  v0 = (v0 + v1) | 0; v1 = (v1 << 5) | (v1 >>> 27); v1 ^= v0; v0 = (v0 << 16) | (v0 >>> 16);
  v2 = (v2 + v3) | 0; v3 = (v3 << 8) | (v3 >>> 24); v3 ^= v2;
  v0 = (v0 + v3) | 0; v3 = (v3 << 7) | (v3 >>> 25); v3 ^= v0;
  v2 = (v2 + v1) | 0; v1 = (v1 << 13) | (v1 >>> 19); v1 ^= v2; v2 = (v2 << 16) | (v2 >>> 16);
  v0 ^= m;
  m = w2 | 0;
  v3 ^= m;
  v0 = (v0 + v1) | 0; v1 = (v1 << 5) | (v1 >>> 27); v1 ^= v0; v0 = (v0 << 16) | (v0 >>> 16);
  v2 = (v2 + v3) | 0; v3 = (v3 << 8) | (v3 >>> 24); v3 ^= v2;
  v0 = (v0 + v3) | 0; v3 = (v3 << 7) | (v3 >>> 25); v3 ^= v0;
  v2 = (v2 + v1) | 0; v1 = (v1 << 13) | (v1 >>> 19); v1 ^= v2; v2 = (v2 << 16) | (v2 >>> 16);
  v0 ^= m;
  const end = start + count;
  for (let i = start; i < end; i++) {
    m = words[i] | 0;
    v3 ^= m;
    v0 = (v0 + v1) | 0; v1 = (v1 << 5) | (v1 >>> 27); v1 ^= v0; v0 = (v0 << 16) | (v0 >>> 16);
    v2 = (v2 + v3) | 0; v3 = (v3 << 8) | (v3 >>> 24); v3 ^= v2;
    v0 = (v0 + v3) | 0; v3 = (v3 << 7) | (v3 >>> 25); v3 ^= v0;
    v2 = (v2 + v1) | 0; v1 = (v1 << 13) | (v1 >>> 19); v1 ^= v2; v2 = (v2 << 16) | (v2 >>> 16);
    v0 ^= m;
  }
  // The final word carries the message length in bytes, as in the reference.
  const b = (((count + 3) * 4) & 0xff) << 24;
  v3 ^= b;
  v0 = (v0 + v1) | 0; v1 = (v1 << 5) | (v1 >>> 27); v1 ^= v0; v0 = (v0 << 16) | (v0 >>> 16);
  v2 = (v2 + v3) | 0; v3 = (v3 << 8) | (v3 >>> 24); v3 ^= v2;
  v0 = (v0 + v3) | 0; v3 = (v3 << 7) | (v3 >>> 25); v3 ^= v0;
  v2 = (v2 + v1) | 0; v1 = (v1 << 13) | (v1 >>> 19); v1 ^= v2; v2 = (v2 << 16) | (v2 >>> 16);
  v0 ^= b;
  v2 ^= 0xee;
  for (let r = 0; r < 3; r++) {
    v0 = (v0 + v1) | 0; v1 = (v1 << 5) | (v1 >>> 27); v1 ^= v0; v0 = (v0 << 16) | (v0 >>> 16);
    v2 = (v2 + v3) | 0; v3 = (v3 << 8) | (v3 >>> 24); v3 ^= v2;
    v0 = (v0 + v3) | 0; v3 = (v3 << 7) | (v3 >>> 25); v3 ^= v0;
    v2 = (v2 + v1) | 0; v1 = (v1 << 13) | (v1 >>> 19); v1 ^= v2; v2 = (v2 << 16) | (v2 >>> 16);
  }
  const lo = v1 ^ v3;
  v1 ^= 0xdd;
  for (let r = 0; r < 3; r++) {
    v0 = (v0 + v1) | 0; v1 = (v1 << 5) | (v1 >>> 27); v1 ^= v0; v0 = (v0 << 16) | (v0 >>> 16);
    v2 = (v2 + v3) | 0; v3 = (v3 << 8) | (v3 >>> 24); v3 ^= v2;
    v0 = (v0 + v3) | 0; v3 = (v3 << 7) | (v3 >>> 25); v3 ^= v0;
    v2 = (v2 + v1) | 0; v1 = (v1 << 13) | (v1 >>> 19); v1 ^= v2; v2 = (v2 << 16) | (v2 >>> 16);
  }
  const hi = (v1 ^ v3) & 0x1fffff;
  return hi * TWO_POW_32 + (lo >>> 0);
}

const DOMAIN_ENGINE_INT = 0x10;
const DOMAIN_ENGINE_BIG = 0x11;
const DOMAIN_ENGINE_BYTES = 0x100;
const NO_WORDS: readonly number[] = [];
const MASK_32 = 0xffff_ffffn;

/**
 * An engine's block hash (a safe integer, a bigint, or its bytes as a latin1 string) as a
 * keyed 53-bit integer: the engine chooses its hashes, and V8 hashes integer Map keys without
 * a seed, so a publisher could otherwise pick values that all land in one bucket.
 */
export function engineHashKey(key: HashKey, hash: number | bigint | string): number {
  if (typeof hash === 'number') return halfSipHash53(key, DOMAIN_ENGINE_INT, floor(hash / TWO_POW_32) | 0, hash >>> 0, NO_WORDS, 0, 0);
  if (typeof hash === 'bigint') {
    const words: number[] = [];
    // Two's complement words, low first, until what is left is all sign.
    let rest = hash;
    do {
      words.push(Number(rest & MASK_32));
      rest >>= 32n;
    } while (rest !== 0n && rest !== -1n);
    return halfSipHash53(key, DOMAIN_ENGINE_BIG, words.length, hash < 0n ? 1 : 0, words, 0, words.length);
  }
  const words = new Array<number>((hash.length + 3) >> 2).fill(0);
  for (let i = 0; i < hash.length; i++) words[i >> 2] |= (hash.charCodeAt(i) & 0xff) << ((i & 3) * 8);
  return halfSipHash53(key, DOMAIN_ENGINE_BYTES + hash.length, 0, 0, words, 0, words.length);
}
