import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { MOCK_TOKENIZER_DIR } from '../../../example-server/mock-vllm/tokenize';
import { CHUNK_CHARS, forEachChunk, nextTextCut } from '../../../lib/exact-prefix/tokenizer/text-cuts';
import { PieceCache } from '../../../lib/exact-prefix/tokenizer/piece-cache';
import { PromptTokenizer, readTokenizerFiles } from '../../../lib/exact-prefix/tokenizer/tokenizer';

const files = readTokenizerFiles(MOCK_TOKENIZER_DIR);

function prompt(outcome: ReturnType<PromptTokenizer['tokenize']>): number[] {
  if ('refused' in outcome) throw new Error(`refused: ${outcome.refused}`);
  return outcome.prompts[0];
}

/** Prose-like text from a mixed alphabet: words of Latin, CJK, Cyrillic, digits, emoji, with spaces, punctuation and newlines between. */
const mixedText = fc
  .array(
    fc.tuple(
      fc.constantFrom('the', 'Quick', 'brown', "fox's", 'naïve', 'e\u0301t\u00e9', '我们', '今天去公园', 'テスト', '안녕', 'мир', '12345', '3.14', '🚀', 'x_y', 'ﬁn', '𝐛𝐨𝐥𝐝', 'नमस्ते'),
      fc.constantFrom(' ', '  ', '. ', ', ', '。', '，', '\n', '\n\n', '\t', '! ', '?', '-', "'", '"', ' (', ') ', ''),
    ),
    { maxLength: 300 },
  )
  .map((parts) => parts.map(([word, gap]) => word + gap).join(''));

describe('text cuts', () => {
  it('fall after a letter followed by a space, a newline or punctuation, and depend only on the text up to them', () => {
    expect(nextTextCut('ab cd', 0)).toBe(2);
    expect(nextTextCut('ab cd', 3)).toBe(-1);
    expect(nextTextCut('abc。def', 1)).toBe(3);
    expect(nextTextCut('12 34', 0)).toBe(-1);
    expect(nextTextCut('a  b', 2)).toBe(-1);
    // An astral letter is one letter (two UTF-16 units).
    expect(nextTextCut('x 𝐛 y', 3)).toBe(4);
    fc.assert(
      fc.property(mixedText, mixedText, mixedText, (shared, tailA, tailB) => {
        const cutsOf = (text: string) => {
          const ends: number[] = [];
          forEachChunk(text, CHUNK_CHARS, (start, end) => {
            expect(start === 0 || end - start <= text.length).toBe(true);
            ends.push(end);
          });
          return ends;
        };
        const a = cutsOf(shared + tailA);
        const b = cutsOf(shared + tailB);
        // Every chunk ends where the next starts, and all but the last are CHUNK_CHARS or longer.
        for (let i = 0; i + 1 < a.length; i++) expect(a[i] - (i === 0 ? 0 : a[i - 1])).toBeGreaterThanOrEqual(CHUNK_CHARS);
        // Along the shared prefix (short of the character after a cut), both are cut alike.
        const along = (ends: number[]) => ends.filter((end) => end < shared.length);
        expect(along(a)).toEqual(along(b));
      }),
      { numRuns: 100 },
    );
  });
});

describe('PromptTokenizer cutting completions prompts between words', () => {
  it('gives the same tokens as tokenizing the whole prompt, over random mixed-script prompts sharing prefixes', () => {
    // One tokenizer for all runs, so that later prompts take chunks cached by earlier ones.
    const tokenizer = new PromptTokenizer(files, { selfCheckRequests: 0 });
    fc.assert(
      fc.property(mixedText, mixedText, fc.boolean(), (shared, tail, special) => {
        for (const text of [shared + tail, shared]) {
          expect(prompt(tokenizer.tokenize('completions', { prompt: text, add_special_tokens: special }))).toEqual(tokenizer.encodeWhole(text, special));
        }
      }),
      { numRuns: 40 },
    );
    expect(tokenizer.stats()).toMatchObject({ segmenting: true, cuttingText: true, wordCache: true });
    expect(tokenizer.stats().hits).toBeGreaterThan(0);
  });

  it('tokenizes a prompt that starts like an earlier one from its last shared cut only', () => {
    const shared = 'variant 0 system prompt: ' + 'the quick brown fox jumps over the lazy dog. '.repeat(200);
    // Budgeted below the shared prefix: with the prompt one piece, the second request was refused.
    const tokenizer = new PromptTokenizer(files, { maxUncachedChars: 4 * CHUNK_CHARS });
    tokenizer.encode(`${shared} question 1: what comes next?`, true);
    const before = tokenizer.stats();
    const text = `${shared} question 2: and then?`;
    expect(prompt(tokenizer.tokenize('completions', { prompt: text }))).toEqual(tokenizer.encodeWhole(text, true));
    const after = tokenizer.stats();
    expect(after.misses - before.misses).toBeLessThanOrEqual(2);
    expect(after.hits - before.hits).toBeGreaterThanOrEqual(Math.floor(shared.length / (2 * CHUNK_CHARS)));
  });

  it('counts the budget in UTF-8 bytes, so CJK text (3 bytes a character) takes its cost out of it (item 22.15)', () => {
    const tokenizer = new PromptTokenizer(files, { maxUncachedChars: 1000, selfCheckRequests: 0 });
    // 400 characters, 1,200 bytes: counted in UTF-16 units it fitted, and CJK cost ~3× per unit.
    expect(tokenizer.tokenize('completions', { prompt: '我们今天去公园'.repeat(57).slice(0, 400) })).toEqual({ refused: 'too_long' });
    expect('prompts' in tokenizer.tokenize('completions', { prompt: '我们今天去公园'.repeat(57).slice(0, 300) })).toBe(true);
    expect('prompts' in tokenizer.tokenize('completions', { prompt: 'x'.repeat(990) })).toBe(true);
  });

  it('keeps the word cache and the chunks within cacheBytes', () => {
    const small = new PromptTokenizer(files, { cacheBytes: 64 * 1024, selfCheckRequests: 0 });
    for (let i = 0; i < 100; i++) small.tokenize('completions', { prompt: `request ${i}: ${'word' + i + ' '}`.repeat(120) });
    expect(small.stats().cachedBytes).toBeLessThanOrEqual(64 * 1024);
    expect(small.stats().cachedBytes).toBeGreaterThan(16 * 1024);
  });

  it('does not cut between words for a tokenizer whose pieces tokenize otherwise alone, and still answers exact tokens', () => {
    // As SentencePiece's prefix space would: a piece starting with a space tokenizes differently alone.
    class PrefixSpace extends PromptTokenizer {
      override encodeWhole(text: string, addSpecialTokens: boolean): number[] {
        const ids = super.encodeWhole(text, addSpecialTokens);
        return text.startsWith(' ') ? [0, ...ids] : ids;
      }
    }
    const tokenizer = new PrefixSpace(files, { selfCheckRequests: 0 });
    const text = 'a long prompt, made of words. '.repeat(40);
    expect(prompt(tokenizer.tokenize('completions', { prompt: text, add_special_tokens: false }))).toEqual(tokenizer.encodeWhole(text, false));
    expect(tokenizer.stats()).toMatchObject({ cuttingText: false });
  });

  it('goes through the library, not the word cache, for a pre-tokenizer of another shape', () => {
    const gpt2 = structuredClone(files);
    // GPT-2's layout: ByteLevel splitting with its own pattern, no Split step.
    gpt2.tokenizer.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
    const tokenizer = new PromptTokenizer(gpt2, { selfCheckRequests: 0 });
    const text = "It's a prompt: 12345 words, 我们今天去公园。 ".repeat(20);
    expect(prompt(tokenizer.tokenize('completions', { prompt: text }))).toEqual(tokenizer.encodeWhole(text, true));
    expect(tokenizer.stats()).toMatchObject({ wordCache: false, cuttingText: true });
  });
});

describe('PieceCache', () => {
  it('evicts, past its bytes, the first entry not hit since the hand passed, and counts what it holds', () => {
    const cache = new PieceCache(4 * 200);
    const ids = Array.from({ length: 10 }, (_, i) => i);
    // Each entry: 20 units of text (40 bytes) + 10 ids (80) + 80 = 200 bytes.
    const key = (name: string) => name.padEnd(20, '.');
    cache.set(key('a'), ids);
    cache.set(key('b'), ids);
    cache.set(key('c'), ids);
    cache.set(key('d'), ids);
    expect(cache.get(key('a'))).toBe(ids);
    cache.set(key('e'), ids);
    // a was hit (a second chance), so b went.
    expect(['a', 'b', 'c', 'd', 'e'].map((name) => cache.get(key(name)) !== undefined)).toEqual([true, false, true, true, true]);
    expect(cache.heldBytes).toBe(800);
    // Setting a key again replaces its entry, counted once.
    cache.set(key('e'), ids);
    expect(cache.heldBytes).toBe(800);
  });
});
