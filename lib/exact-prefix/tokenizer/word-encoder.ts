/**
 * A faster way through a byte-level BPE tokenizer (Llama 3, Qwen, DeepSeek: a `Sequence` of
 * `Split` patterns, then `ByteLevel` without its own pattern, then `BPE`): the text is split by
 * the tokenizer's own patterns, and each word's ids are cached by the word as written, so a
 * word seen before costs one map lookup instead of its byte-level mapping, its merges and an
 * id lookup per token (together ~4 µs a token in `@huggingface/tokenizers`).
 *
 * It reaches into the library's pipeline (its normalizer, pre-tokenizer steps, model and
 * added-token map), exactly as `Tokenizer.encode` runs them for a text without added tokens;
 * {@link WordEncoder.of} declines any other shape, and tokenizer.ts checks it against the
 * library's own `encode` on samples before using it.
 */
import type { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { ownString } from './piece-cache';

/** Words longer than this are not cached (they rarely come back, and cost their length). */
const MAX_CACHED_WORD = 64;
const ENTRY_OVERHEAD_BYTES = 80;

type Step = { pre_tokenize_text(text: string, options?: unknown): string[] };
type ByteStep = { pre_tokenize_text(text: string, options?: unknown): string[] };

/** The library's internals this reads, all present in @huggingface/tokenizers 0.2. */
interface Internals {
  normalizer: ((text: string) => string) | null;
  pre_tokenizer: { tokenizers?: unknown[] } | null;
  model: ((tokens: string[]) => string[]) & { tokens_to_ids?: Map<string, number>; unk_token_id?: number };
  added_tokens_map?: Map<string, { id: number }>;
  remove_space?: unknown;
  do_lowercase_and_remove_accent?: unknown;
}

/** Encodes text without added tokens, word by word through a bounded cache. */
export class WordEncoder {
  private readonly words = new Map<string, number[]>();
  private held = 0;

  private constructor(
    private readonly normalize: ((text: string) => string) | null,
    private readonly splits: readonly Step[],
    private readonly bytes: ByteStep,
    private readonly model: (tokens: string[]) => string[],
    private readonly ids: Map<string, number>,
    private readonly added: Map<string, { id: number }>,
    private readonly unknown: number | undefined,
    private readonly maxBytes: number,
  ) {}

  /**
   * The encoder for `tokenizer` (built from `json`, its tokenizer.json) when its pipeline has
   * the shape this follows; `undefined` otherwise.
   */
  static of(tokenizer: HfTokenizer, json: Record<string, unknown>, maxBytes: number): WordEncoder | undefined {
    const inner = tokenizer as unknown as Internals;
    const pre = json.pre_tokenizer as { type?: unknown; pretokenizers?: Array<Record<string, unknown>> } | null | undefined;
    const model = json.model as Record<string, unknown> | undefined;
    if (pre?.type !== 'Sequence' || !Array.isArray(pre.pretokenizers) || pre.pretokenizers.length < 2) return undefined;
    const configs = pre.pretokenizers;
    const last = configs[configs.length - 1];
    if (last.type !== 'ByteLevel' || last.use_regex !== false || last.add_prefix_space === true) return undefined;
    if (!configs.slice(0, -1).every((config) => config.type === 'Split')) return undefined;
    // fuse_unk joins unknown tokens across words; normalized added tokens are matched after the normalizer.
    if (model?.type !== 'BPE' || model.fuse_unk === true) return undefined;
    if (inner.remove_space === true || inner.do_lowercase_and_remove_accent === true) return undefined;
    const steps = inner.pre_tokenizer?.tokenizers;
    const ids = inner.model?.tokens_to_ids;
    const added = inner.added_tokens_map;
    if (!Array.isArray(steps) || steps.length !== configs.length || !(ids instanceof Map) || !(added instanceof Map)) return undefined;
    if (typeof inner.model !== 'function') return undefined;
    const added_tokens = json.added_tokens;
    if (Array.isArray(added_tokens) && added_tokens.some((token: { normalized?: unknown }) => token?.normalized === true)) return undefined;
    return new WordEncoder(inner.normalizer, steps.slice(0, -1) as Step[], steps[steps.length - 1] as ByteStep, inner.model, ids, added, inner.model.unk_token_id, maxBytes);
  }

  /** Bytes the word cache holds. */
  get heldBytes(): number {
    return this.held;
  }

  /** Appends the ids of `text` (which holds no added token) to `into`. */
  encode(text: string, into: number[]): void {
    if (text.length === 0) return;
    const normalized = this.normalize === null ? text : this.normalize(text);
    // pre_tokenize_text, not pre_tokenize: the same pieces without an array flattened per step.
    let words = this.splits[0].pre_tokenize_text(normalized);
    for (let at = 1; at < this.splits.length; at++) words = words.flatMap((word) => this.splits[at].pre_tokenize_text(word));
    for (const word of words) {
      if (word.length === 0) continue;
      let ids = this.words.get(word);
      if (ids === undefined) {
        ids = this.encodeWord(word);
        if (word.length <= MAX_CACHED_WORD) this.keep(word, ids);
      }
      for (let i = 0; i < ids.length; i++) into.push(ids[i]);
    }
  }

  clear(): void {
    this.words.clear();
    this.held = 0;
  }

  private encodeWord(word: string): number[] {
    const tokens = this.model(this.bytes.pre_tokenize_text(word));
    const ids: number[] = [];
    // As Tokenizer.encode maps tokens to ids.
    for (const token of tokens) {
      const id = this.added.get(token)?.id ?? this.ids.get(token) ?? this.unknown;
      if (id !== undefined) ids.push(id);
    }
    return ids;
  }

  private keep(word: string, ids: number[]): void {
    const bytes = word.length * 2 + ids.length * 8 + ENTRY_OVERHEAD_BYTES;
    // Full: start over (O(1) a word amortized; common words are back within a few requests).
    if (this.held + bytes > this.maxBytes) this.clear();
    // The word is a slice of the request's text: a copy keeps it from holding that alive.
    this.words.set(ownString(word), ids);
    this.held += bytes;
  }
}
