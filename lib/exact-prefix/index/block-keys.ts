/**
 * A prompt's block keys shared between the exact index's `match()` and `speculate()`.
 */
import { chainHash, type HashKey } from './keyed-hash';

/** The keyed-hash domain of a block's router key (its chain link). */
export const DOMAIN_BLOCK = 3;

/**
 * The router keys of one prompt's leading full blocks, as far as `match()` or `speculate()`
 * computed them: hashing a block is most of what either costs (a keyed hash per 16 tokens), and
 * a routed request does both. Start with `{ size: 0, loraName: undefined, values: [] }`.
 */
export interface BlockKeys {
  size: number;
  loraName: string | undefined;
  /** The request's `cache_salt`, which keys its first block (and so every block after it). */
  salt?: string | undefined;
  values: number[];
}

/** `keys`, emptied first when they were computed for another block size, adapter or salt. */
export function keysFor(keys: BlockKeys, size: number, loraName: string | undefined, salt?: string): BlockKeys {
  if (keys.size !== size || keys.loraName !== loraName || keys.salt !== salt) {
    keys.size = size;
    keys.loraName = loraName;
    keys.salt = salt;
    keys.values.length = 0;
  }
  return keys;
}

/** Block `b`'s router key after `chain` (block b − 1's), from `keys` when computed already, else hashed and kept there. */
export function nextKey(key: HashKey, keys: BlockKeys | undefined, chain: number, tokens: ArrayLike<number>, b: number, size: number): number {
  if (keys === undefined) return chainHash(key, DOMAIN_BLOCK, chain, tokens, b * size, size);
  if (b < keys.values.length) return keys.values[b];
  const next = chainHash(key, DOMAIN_BLOCK, chain, tokens, b * size, size);
  keys.values.push(next);
  return next;
}
