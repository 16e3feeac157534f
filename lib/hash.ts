import { randomBytes } from 'node:crypto';

/**
 * Fast non-cryptographic 32-bit hashing (MurmurHash3's mixing) shared by the affinity and
 * prefix policies. Results are signed 32-bit integers: on 64-bit V8 they stay small
 * integers, so Map lookups keyed by them never allocate.
 *
 * Two kinds of hash, kept apart on purpose:
 * - **content hashes** (`hashString`, `combine32`) are deterministic, so that gateway replicas
 *   agree on them (a session's rendezvous order, a prefix's identity). A client can compute
 *   them too, so they must never choose a slot in a table a client can fill;
 * - **slot hashes** (`keyedMix32`) mix a content hash with a random per-table key, so that no
 *   client can forge values that pile into one slot (hash flooding).
 */

// A module binding, not a global read per call: code run in a vm context (jest) pays an
// interceptor lookup for each global it reads, 40x this loop's own cost; plain Node compiles
// both forms alike.
const { imul } = Math;

/** MurmurHash3's finaliser: a bijective avalanche mix of one 32-bit value. */
export function mix32(value: number): number {
  let h = value | 0;
  h ^= h >>> 16;
  h = imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h;
}

/** Combines two hashes into one well-mixed value (order matters). */
export function combine32(a: number, b: number): number {
  return mix32(a ^ imul(b, 0x9e3779b1));
}

/**
 * MurmurHash3 (x86, 32-bit) over the UTF-16 code units of `text[start, end)`, read two at
 * a time so the loop runs once per 32 bits. `seed` chains one block's hash into the next.
 */
export function hashString(text: string, seed = 0, start = 0, end = text.length): number {
  let h = seed | 0;
  let i = start;
  for (; i + 1 < end; i += 2) {
    let k = text.charCodeAt(i) | (text.charCodeAt(i + 1) << 16);
    k = imul(k, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    k = imul(k, 0x1b873593);
    h ^= k;
    h = (h << 13) | (h >>> 19);
    h = (imul(h, 5) + 0xe6546b64) | 0;
  }
  if (i < end) {
    let k = text.charCodeAt(i);
    k = imul(k, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    k = imul(k, 0x1b873593);
    h ^= k;
  }
  return mix32(h ^ (end - start));
}

/** A random 32-bit key from the OS's CSPRNG, drawn once per table at creation. */
export function randomKey32(): number {
  return randomBytes(4).readInt32LE(0);
}

/**
 * A bijective keyed mix of one 32-bit value: distinct values stay distinct, and without the key
 * a client cannot tell which of its values land near each other in a table.
 */
export function keyedMix32(value: number, key: number): number {
  return mix32(mix32(value ^ key) + key);
}

/**
 * An endpoint's identity in a rendezvous order: a content hash of its key, so that every
 * gateway replica configured with the same upstreams computes the same value.
 */
export function endpointHash(key: string): number {
  return hashString(key, 0x5bd1e995);
}

/**
 * Rendezvous (highest-random-weight) weight of an endpoint for a content hash, as an unsigned
 * 32-bit value: the endpoint with the highest weight is the hash's first choice, in every
 * replica alike, and removing an endpoint moves only the hashes whose first choice it was.
 */
export function rendezvousWeight(contentHash: number, endpoint: number): number {
  return combine32(contentHash, endpoint) >>> 0;
}
