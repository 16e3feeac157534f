/**
 * The texts a tokenizer is checked on before its text is cut (at added tokens, between words)
 * or goes through the word cache: each check compares the cut tokenization with the library's
 * whole-text one, so what they cover is what the cuts are trusted for.
 */
import { nextTextCut } from './text-cuts';
import type { WordEncoder } from './word-encoder';

/** A chat whose rendering is checked whole against cut at added tokens. */
export const SAMPLE_MESSAGES = [
  { role: 'system', content: '  You are a helpful assistant.\n\n' },
  { role: 'user', content: 'Héllo wörld!  12345 tokens\t\ttabs, 🚀 emoji; "quotes" and \'apostrophes\' ' },
  { role: 'assistant', content: ' Sure.\n' },
  { role: 'user', content: '\n\nAgain   ' },
];
/** Short texts checked whole against cut at added tokens, and through the word cache. */
export const SAMPLE_TEXTS = ['', ' leading space', 'trailing space ', 'line\n\nbreaks\r\n', '  ', 'naïve café 123 4567'];
/** Texts cut between words at every cut, to check that the pieces tokenize as the whole does. */
export const CUT_SAMPLES = [
  "It's the router's job, isn't it? We'll see: don't DON'T they've I'm you'd.  Two  spaces,\ttabs\t\tand\r\nlines\n\n\nend. " +
    'Numbers 12345 and 3.14159, 1,000,000; (parens) [brackets] {braces} "quotes" «guillemets» — dashes – and-hyphens... ok!? ' +
    'function f(x) { return x*2; } // code_with_underscores camelCase snake_case URL https://example.com/a?b=c#d.',
  '我们今天去公园。你好，世界！这是一个测试：中文、标点；还有「引号」和（括号）。これはテストです。カタカナ、ひらがな。안녕하세요, 세계. 한국어 문장입니다!',
  'Ünïcödé e\u0301 combining, ﬁ ligature, Ⅻ numerals, ½ fractions, 𝐛𝐨𝐥𝐝 letters, 🚀 emoji 👩‍💻, Привет, мир. مرحبا بالعالم. नमस्ते दुनिया। Γειά σου.',
];

/** Whether `words` gives `whole`'s tokens on every sample (false too when the library's insides were not what it expects). */
export function wordsAgreeOn(words: WordEncoder, whole: (text: string) => number[]): boolean {
  try {
    return [...SAMPLE_TEXTS, ...CUT_SAMPLES].every((text) => {
      const ids: number[] = [];
      words.encode(text, ids);
      return sameIds(ids, whole(text));
    });
  } catch {
    return false;
  }
}

/** Whether cutting every sample at each of its text cuts and tokenizing the pieces alone gives the whole text's tokens. */
export function textCutsAgreeOn(whole: (text: string) => number[]): boolean {
  return CUT_SAMPLES.every((text) => {
    const ids: number[] = [];
    let start = 0;
    for (let cut = nextTextCut(text, 1); cut !== -1 && cut < text.length; cut = nextTextCut(text, cut + 1)) {
      ids.push(...whole(text.slice(start, cut)));
      start = cut;
    }
    ids.push(...whole(text.slice(start)));
    return sameIds(ids, whole(text));
  });
}

/** Whether two id lists are equal. */
export function sameIds(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
