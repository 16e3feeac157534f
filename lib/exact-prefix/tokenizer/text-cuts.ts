/**
 * Where a text without added tokens may be cut so that its pieces, tokenized each on its own,
 * give the whole text's tokens: a completions prompt (or one long chat message) then shares
 * the cached tokens of its prefix with the requests before it, and only its new tail is
 * tokenized.
 *
 * A cut falls after a letter that is followed by a space, a newline or a punctuation mark. The
 * byte-level BPE pre-tokenizers vLLM's models use (Llama 3's, Qwen's, DeepSeek's and GPT-2's
 * split patterns) split there whatever follows: no pattern matches a letter together with the
 * character after it, and none looks behind, so the text after the cut is split as the whole
 * text is from there; per-character normalizers (NFC, lowercasing, replacing spaces) compose
 * nothing across such a boundary. A tokenizer for which that does not hold (SentencePiece's
 * prefix space, a pattern that reaches across) is found out on samples at load and on the first
 * requests (tokenizer.ts), and then not cut.
 *
 * Chunks are cut at least {@link CHUNK_CHARS} apart, and a chunk not in the cache again at
 * least {@link FINE_CHARS} apart; each cut depends only on the text up to the character after
 * it, so two prompts sharing a prefix are cut alike along it, and the second tokenizes only
 * what follows the last fine cut before they part.
 */

/** The least length of a chunk between two cuts, in UTF-16 units. */
export const CHUNK_CHARS = 256;
/** The least length of a finer piece, within a chunk the cache does not hold. */
export const FINE_CHARS = 32;

// A letter (astral ones too) followed by a break; the cut is after the letter.
const CUT = /\p{L}(?=[ \n\p{P}])/gu;

/**
 * The first cut in `text` at or after `from` (a position between two UTF-16 units: the pieces
 * are `text.slice(0, cut)` and `text.slice(cut)`), or -1 when there is none.
 */
export function nextTextCut(text: string, from: number): number {
  // Two units back, so that a letter (one or two units) ending at `from` is seen.
  CUT.lastIndex = Math.max(0, from - 2);
  for (let match = CUT.exec(text); match !== null; match = CUT.exec(text)) {
    const cut = match.index + match[0].length;
    if (cut >= from) return cut;
  }
  return -1;
}

/** The pieces of `text` between its cuts, each at least `least` long but the last; `visit(start, end)` per piece. */
export function forEachChunk(text: string, least: number, visit: (start: number, end: number) => void): void {
  let start = 0;
  while (start < text.length) {
    const cut = text.length - start > least ? nextTextCut(text, start + least) : -1;
    const end = cut === -1 || cut >= text.length ? text.length : cut;
    visit(start, end);
    start = end;
  }
}
