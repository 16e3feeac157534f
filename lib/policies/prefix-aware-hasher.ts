import { hashPromptBlocks } from './prefix-aware-index';

// Module bindings, not global reads in the loop: code run in a vm context (jest) pays an
// interceptor lookup for each global it reads.
const { imul } = Math;

/** Whether a `Uint32` read of two UTF-16 code units gives `first | second << 16`, as `hashString` reads them. */
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * The chained block hashes of `prefix-aware` (exactly {@link hashPromptBlocks}'s, so replicas
 * of any version agree), computed a faster way: the prompt's UTF-16 code units are copied once
 * into a buffer by `Buffer#write` (native, a memory copy) and hashed 32 bits per read, where
 * `hashString` pays two `charCodeAt` per 32 bits (each a check of the string's representation).
 * About a quarter of the instructions of hashing 8 KB. With an odd `blockChars` (a block's
 * pairs would straddle words) or on a big-endian machine it falls back to `hashPromptBlocks`.
 *
 * Memory: the hash array and a buffer of 2 bytes per character of the longest prompt hashed
 * (at most `maxBlocks × blockChars` characters), grown by doubling, never shrunk.
 */
export class PromptBlockHasher {
  /** The last prompt's block hashes, in its first `count` entries (the array is replaced as it grows). */
  hashes = new Int32Array(256);
  private bytes = Buffer.alloc(0);
  private words = new Int32Array(0);
  private readonly wordwise: boolean;

  constructor(
    private readonly blockChars: number,
    private readonly maxBlocks: number,
  ) {
    this.wordwise = LITTLE_ENDIAN && blockChars % 2 === 0;
  }

  /** Hashes the prompt's first whole blocks (at most `maxBlocks`) into `hashes`; returns how many. */
  hash(prompt: string): number {
    const blockChars = this.blockChars;
    const count = Math.min(Math.floor(prompt.length / blockChars), this.maxBlocks);
    if (count > this.hashes.length) this.hashes = new Int32Array(Math.min(Math.max(count, this.hashes.length * 2), this.maxBlocks));
    if (!this.wordwise) return hashPromptBlocks(prompt, blockChars, count, this.hashes);
    const byteLength = count * blockChars * 2;
    if (byteLength > this.bytes.length) this.grow(byteLength);
    this.bytes.write(prompt, 0, byteLength, 'utf16le');
    const words = this.words;
    const hashes = this.hashes;
    const half = blockChars >>> 1;
    const total = count * half;
    if ((half & 1) === 0) {
      hashWordPairs(words, total, half, blockChars, hashes);
      return count;
    }
    // One flat loop over the words (a block's end handled inside it): V8 peels an innermost
    // loop's first iteration, which takes the typed array's checks out of the rest.
    let h = 0;
    let blockEnd = half - 1;
    let block = 0;
    for (let w = 0; w < total; w++) {
      // MurmurHash3 x86-32 of the block, seeded with the previous block's hash: `hashString`'s loop.
      let k = words[w];
      k = imul(k, 0xcc9e2d51);
      k = (k << 15) | (k >>> 17);
      h ^= imul(k, 0x1b873593);
      h = (h << 13) | (h >>> 19);
      h = (imul(h, 5) + 0xe6546b64) | 0;
      if (w === blockEnd) {
        // `mix32(h ^ blockChars)`.
        h ^= blockChars;
        h ^= h >>> 16;
        h = imul(h, 0x85ebca6b);
        h ^= h >>> 13;
        h = imul(h, 0xc2b2ae35);
        h ^= h >>> 16;
        hashes[block++] = h;
        blockEnd += half;
      }
    }
    return count;
  }

  private grow(byteLength: number): void {
    const limit = this.maxBlocks * this.blockChars * 2;
    const size = Math.min(Math.max(byteLength, this.bytes.length * 2, 4096), limit);
    // A buffer of its own (not a slice of Node's pool), so that the word view is aligned.
    const buffer = new ArrayBuffer(size);
    this.bytes = Buffer.from(buffer);
    this.words = new Int32Array(buffer, 0, size >>> 2);
  }
}

/**
 * `PromptBlockHasher#hash`'s loop for blocks of an even number of words (the default 64
 * characters: 32), two words a turn: the loop's own work (the typed array's checks, the
 * interrupt check, the block's end) costs more than the hash's six instructions a word.
 */
function hashWordPairs(words: Int32Array, total: number, half: number, blockChars: number, hashes: Int32Array): void {
  let h = 0;
  let blockEnd = half - 2;
  let block = 0;
  for (let w = 0; w < total; w += 2) {
    let k = words[w];
    k = imul(k, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    h ^= imul(k, 0x1b873593);
    h = (h << 13) | (h >>> 19);
    h = (imul(h, 5) + 0xe6546b64) | 0;
    k = words[w + 1];
    k = imul(k, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    h ^= imul(k, 0x1b873593);
    h = (h << 13) | (h >>> 19);
    h = (imul(h, 5) + 0xe6546b64) | 0;
    if (w === blockEnd) {
      h ^= blockChars;
      h ^= h >>> 16;
      h = imul(h, 0x85ebca6b);
      h ^= h >>> 13;
      h = imul(h, 0xc2b2ae35);
      h ^= h >>> 16;
      hashes[block++] = h;
      blockEnd += half;
    }
  }
}
