import { combine32, mix32 } from '../../lib/hash';

/** vLLM's KV cache block size in tokens: only full blocks are cached and matched. */
export const TOKENS_PER_BLOCK = 16;

const ALPHABET = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_';
const textOfToken = new Map<number, string>();

/** A token as the policies see it: 4 deterministic characters, about a real token's length. */
export function tokenText(token: number): string {
  let text = textOfToken.get(token);
  if (text === undefined) {
    const bits = mix32(token);
    text =
      ALPHABET[bits & 63] + ALPHABET[(bits >>> 6) & 63] + ALPHABET[(bits >>> 12) & 63] + ALPHABET[(bits >>> 18) & 63];
    textOfToken.set(token, text);
  }
  return text;
}

/** The text of a token sequence. */
export function tokensText(tokens: readonly number[]): string {
  return tokens.map(tokenText).join('');
}

/** vLLM-style chained hashes of the full blocks: block i's hash covers tokens 0 … 16(i+1)−1. */
export function blockHashes(tokens: readonly number[]): Int32Array {
  const count = Math.floor(tokens.length / TOKENS_PER_BLOCK);
  const hashes = new Int32Array(count);
  let hash = 0x1234567;
  for (let block = 0; block < count; block++) {
    for (let i = block * TOKENS_PER_BLOCK; i < (block + 1) * TOKENS_PER_BLOCK; i++) hash = combine32(hash, tokens[i]);
    hashes[block] = hash;
  }
  return hashes;
}
