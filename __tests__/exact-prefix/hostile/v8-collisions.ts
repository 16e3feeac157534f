/**
 * Small integers whose V8 Map hashes share their low 12 bits (V8 hashes Smi keys with the
 * unseeded ComputeUnseededHash, which is invertible): a Map holding them puts them in a few
 * buckets. What a hostile publisher can send as block hashes.
 */
function inverseOdd(a: number): number {
  let x = 1;
  for (let i = 0; i < 5; i++) x = Math.imul(x, (2 - Math.imul(a, x)) >>> 0) >>> 0;
  return x;
}

function unXorShiftRight(h: number, shift: number): number {
  let r = h;
  for (let i = 0; i < 32; i += shift) r = (h ^ (r >>> shift)) >>> 0;
  return r;
}

function unseededHash(k: number): number {
  let h = k >>> 0;
  h = (~h + (h << 15)) >>> 0;
  h = (h ^ (h >>> 12)) >>> 0;
  h = (h + (h << 2)) >>> 0;
  h = (h ^ (h >>> 4)) >>> 0;
  h = Math.imul(h, 2057) >>> 0;
  h = (h ^ (h >>> 16)) >>> 0;
  return h & 0x3fffffff;
}

function invert(hash: number): number {
  let h = unXorShiftRight(hash, 16);
  h = Math.imul(h, inverseOdd(2057)) >>> 0;
  h = unXorShiftRight(h, 4);
  h = Math.imul(h, inverseOdd(5)) >>> 0;
  h = unXorShiftRight(h, 12);
  // ~k + (k << 15) = 32767k − 1
  return Math.imul((h + 1) >>> 0, inverseOdd(32767)) | 0;
}

/** `count` distinct Smi-range integers whose V8 hashes end in the same 12 bits. */
export function collidingIntegers(count: number): number[] {
  const out: number[] = [];
  for (let i = 0; out.length < count && i < 1 << 20; i++) {
    const target = ((i << 12) | 0x123) >>> 0;
    const key = invert(target);
    if (key >= -(2 ** 30) && key < 2 ** 30 && key !== 0 && unseededHash(key) === (target & 0x3fffffff)) out.push(key);
  }
  return out;
}
