/**
 * A request's prompt as the engine's token ids, computed in the router from the model's own
 * tokenizer files, so the exact KV index can be looked up before the request is sent.
 *
 * What vLLM does, and so what this does: `/v1/chat/completions` renders the messages with the
 * chat template (see tokenizer-chat.ts) and tokenizes the text with `add_special_tokens: false`
 * (the template wrote them); `/v1/completions` tokenizes a text prompt with
 * `add_special_tokens: true` (the post-processor's BOS) and takes a token-array prompt as it is;
 * either endpoint's `add_special_tokens` field overrides the default.
 *
 * Shared prefixes are not tokenized again: the text is cut at the tokenizer's added tokens
 * (`<|eot_id|>`, `<|im_start|>`, ...), which the tokenizer itself splits on before any other
 * step, so each piece between them tokenizes on its own to the same ids; a long piece (a
 * completions prompt, a long message) is cut again between words every 256 characters or so
 * (text-cuts.ts); pieces are cached (LRU, bounded in bytes). A chat template puts added tokens
 * around every message, so a system prompt seen before costs a few map lookups, and a
 * completions prompt that starts like an earlier one is tokenized from its last shared cut
 * only. A byte-level BPE tokenizer's new text goes through a cache of words
 * (word-encoder.ts). Whether cutting is exact for this tokenizer (a normalizer or
 * pre-tokenizer could treat the start of the text specially) is checked on samples at load and
 * on the first requests against whole-text tokenization; on any difference the cache keeps
 * whole texts only.
 */
import type { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { chatSupport } from './chat-support';
import { TOO_LONG, isRefused, type Refused, type RenderRefusal } from './refusals';
import { argumentWeight } from './argument-weight';
import { laxBool } from './template-arguments';
import type { ChatRenderer } from './tokenizer-chat';
import { addedTokens, alternation, loadTokenizersPackage, readTokenizerFiles, type TokenizerFiles } from './tokenizer-files';
import { IdParts } from './id-parts';
import { PieceCache } from './piece-cache';
import { CHUNK_CHARS, FINE_CHARS, forEachChunk } from './text-cuts';
import { SAMPLE_MESSAGES, SAMPLE_TEXTS, sameIds, textCutsAgreeOn, wordsAgreeOn } from './tokenizer-samples';
import type { PromptKind, PromptTokenizerOptions, PromptTokenizerStats, TokenizeOutcome } from './tokenizer-options';
import { WordEncoder } from './word-encoder';

export type { Refused, RenderRefusal } from './refusals';
export { readTokenizerFiles, type TokenizerFiles } from './tokenizer-files';
export type { PromptKind, PromptTokenizerOptions, PromptTokenizerStats, TokenizeOutcome } from './tokenizer-options';

const DEFAULT_CACHE_BYTES = 32 * 1024 * 1024;
const DEFAULT_MAX_UNCACHED_CHARS = 32_768;
const DEFAULT_MAX_MESSAGES = 1_024;
const RENDER_CHARS_PER_BUDGET = 16;
/** A message's rendering (~25–40 µs) as new text: about what tokenizing 16 bytes of CJK costs. */
const RENDER_BYTES_PER_MESSAGE = 16;
/**
 * Weight of template arguments (argument-weight.ts) per byte of the budget: converting and
 * writing a tool out (`tojson`) costs about 0.25 µs a character, an eighth of what tokenizing a
 * byte of new text does (bench/template-budget.ts).
 */
const ARGUMENT_CHARS_PER_BUDGET = 8;
/** Thrown inside one tokenize() call when its budget runs out; never escapes it. */
const OVER_BUDGET = new Error('over budget');

/** Tokenizes requests' prompts with one model's tokenizer; pure and synchronous. */
export class PromptTokenizer {
  private readonly tokenizer: HfTokenizer;
  private readonly chat: ChatRenderer | undefined;
  /** What the router cannot do with these files as vLLM does (each a sentence naming the files), for a warning at creation. */
  readonly notices: readonly string[];
  private readonly splitter: RegExp | undefined;
  private readonly addedIds: Map<string, number | undefined>;
  /** Each added token's id as a one-id array, for {@link IdParts}. */
  private readonly addedIdArrays: Map<string, readonly number[]>;
  private readonly specialPrefix: number[];
  private readonly specialSuffix: number[];
  private readonly maxUncachedChars: number;
  /** What the request being tokenized may still spend; unlimited outside tokenize(). */
  private budget = Infinity;
  private readonly cache: PieceCache;
  private readonly onSegmentMismatch: ((text: string) => void) | undefined;
  private selfChecks: number;
  private segmenting: boolean;
  /** Whether long pieces are cut between words; checked on samples at the first long piece. */
  private cuttingText: boolean | undefined;
  private words: WordEncoder | undefined;
  /** Whether the word cache was checked on samples (at its first use). */
  private wordsChecked = false;
  private hits = 0;
  private misses = 0;
  private readonly refusals: Record<RenderRefusal, number> = { invalid: 0, unsupported: 0, template_error: 0, too_long: 0 };

  /** Loads a tokenizer from a directory holding `tokenizer.json` (+ `tokenizer_config.json`), the first file, or both paths. */
  static load(path: string | readonly [string, string], options: PromptTokenizerOptions = {}): PromptTokenizer {
    return new PromptTokenizer(readTokenizerFiles(path), options);
  }

  constructor(files: TokenizerFiles, options: PromptTokenizerOptions = {}) {
    const { Tokenizer } = loadTokenizersPackage();
    this.tokenizer = new Tokenizer(files.tokenizer, files.config);
    const cacheBytes = options.cacheBytes ?? DEFAULT_CACHE_BYTES;
    this.cache = new PieceCache(cacheBytes - Math.floor(cacheBytes / 8));
    this.maxUncachedChars = options.maxUncachedChars ?? DEFAULT_MAX_UNCACHED_CHARS;
    // Cached text is cheap to tokenize but not to render: what a request may hold in all is
    // bounded at RENDER_CHARS_PER_BUDGET times the new text it may bring.
    const limits = { maxMessages: options.maxMessages ?? DEFAULT_MAX_MESSAGES, maxChars: this.maxUncachedChars * RENDER_CHARS_PER_BUDGET };
    const chat = chatSupport(files, limits, { ...options.chatTemplateKwargs });
    this.chat = chat.renderer;
    this.notices = chat.notice === undefined ? [] : [chat.notice];
    this.selfChecks = options.selfCheckRequests ?? 32;
    this.onSegmentMismatch = options.onSegmentMismatch;
    this.addedIds = addedTokens(files.tokenizer);
    this.addedIdArrays = new Map([...this.addedIds].flatMap(([token, id]) => (id === undefined ? [] : [[token, [id]] as const])));
    this.splitter = this.addedIds.size === 0 ? undefined : alternation([...this.addedIds.keys()]);
    [this.specialPrefix, this.specialSuffix] = this.postProcessorTokens();
    // The word cache treats a piece as plain text: no added token may be left in one.
    const clean = [...this.addedIds.values()].every((id) => id !== undefined);
    this.words = clean ? WordEncoder.of(this.tokenizer, files.tokenizer, Math.floor(cacheBytes / 8)) : undefined;
    this.segmenting = this.splitter !== undefined && this.cutsAgree();
  }

  /** Whether chat requests are rendered here (not without a chat template, nor for gpt-oss: see {@link notices}); otherwise they are refused as unsupported. */
  get hasChatTemplate(): boolean {
    return this.chat !== undefined;
  }

  /** The token ids of a parsed request body for `kind`'s endpoint, as vLLM would compute them. */
  tokenize(kind: PromptKind, body: unknown): TokenizeOutcome {
    this.budget = this.maxUncachedChars;
    try {
      const outcome = this.tokenizeRequest(kind, body);
      if ('refused' in outcome) this.refusals[outcome.refused]++;
      return outcome;
    } catch (error) {
      if (error !== OVER_BUDGET) throw error;
      this.refusals.too_long++;
      return TOO_LONG;
    } finally {
      this.budget = Infinity;
    }
  }

  private tokenizeRequest(kind: PromptKind, body: unknown): TokenizeOutcome {
    if (typeof body !== 'object' || body === null || Array.isArray(body)) return { refused: 'invalid' };
    const request = body as Record<string, unknown>;
    const special = request.add_special_tokens === undefined || request.add_special_tokens === null ? undefined : laxBool(request.add_special_tokens, false);
    if (special === undefined && request.add_special_tokens !== undefined && request.add_special_tokens !== null) return { refused: 'invalid' };
    if (kind === 'chat') {
      if (!this.chat) return { refused: 'unsupported' };
      // Rendering costs per message what tokenizing some new text does, cached or not: it is
      // charged to the same budget, so that one request costs at most one budget's worth.
      if (Array.isArray(request.messages)) this.spend(request.messages.length * RENDER_BYTES_PER_MESSAGE);
      // So are the template's arguments (tools, documents, kwargs), weighed before rendering.
      this.spend(Math.ceil(argumentWeight(request, this.budget * ARGUMENT_CHARS_PER_BUDGET) / ARGUMENT_CHARS_PER_BUDGET));
      const text = this.chat.render(request);
      if (isRefused(text)) return text;
      return { prompts: [this.encode(text, special ?? false)] };
    }
    return this.completionPrompts(request.prompt, special ?? true);
  }

  /** The rendered chat prompt (what `/tokenize` with `messages` tokenizes). */
  renderChat(body: Record<string, unknown>): string | Refused {
    return this.chat ? this.chat.render(body) : { refused: 'unsupported' };
  }

  /** `text`'s token ids through the prefix cache. */
  encode(text: string, addSpecialTokens: boolean): number[] {
    // A copy: the cached array must not be changed by a caller.
    if (!this.segmenting) return this.cachedPiece(text, addSpecialTokens).slice();
    const ids = this.encodeCut(text, addSpecialTokens);
    // The check tokenizes the whole text, cached or not: it is charged to what the request may
    // still spend, and left to a later request when it does not fit.
    if (this.selfChecks > 0 && this.affords(text)) {
      this.selfChecks--;
      if (!sameIds(ids, this.encodeWhole(text, addSpecialTokens))) {
        this.stopSegmenting(text);
        return this.encodeWhole(text, addSpecialTokens);
      }
    }
    return ids;
  }

  /** `text`'s token ids from the tokenizer alone, no cache. */
  encodeWhole(text: string, addSpecialTokens: boolean): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  /** The text of `ids` (special tokens included). */
  decode(ids: readonly number[]): string {
    if (ids.length === 0) return '';
    return this.tokenizer.decode(ids as number[], { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  }

  /** The vocabulary's string for `id` (e.g. `Ġthe`), as `/tokenize` with `return_token_strs` lists it. */
  tokenString(id: number): string {
    return this.tokenizer.id_to_token(id) ?? '';
  }

  /** Cache counters. */
  stats(): PromptTokenizerStats {
    const cachedBytes = this.cache.heldBytes + (this.words?.heldBytes ?? 0);
    return { refusals: { ...this.refusals }, hits: this.hits, misses: this.misses, cachedBytes, segmenting: this.segmenting, cuttingText: this.segmenting && this.cuttingText !== false, wordCache: this.segmenting && this.words !== undefined, selfChecksLeft: this.selfChecks };
  }

  private completionPrompts(prompt: unknown, special: boolean): TokenizeOutcome {
    if (typeof prompt === 'string') return { prompts: [this.encode(prompt, special)] };
    if (!Array.isArray(prompt) || prompt.length === 0) return { refused: 'invalid' };
    if (isTokenIds(prompt)) return { prompts: [prompt] };
    const prompts: number[][] = [];
    for (const one of prompt) {
      if (typeof one === 'string') prompts.push(this.encode(one, special));
      else if (Array.isArray(one) && one.length > 0 && isTokenIds(one)) prompts.push(one);
      else return { refused: 'invalid' };
    }
    return { prompts };
  }

  private encodeCut(text: string, addSpecialTokens: boolean): number[] {
    const ids = new IdParts();
    if (addSpecialTokens) ids.add(this.specialPrefix);
    const splitter = this.splitter as RegExp;
    splitter.lastIndex = 0;
    let last = 0;
    for (let match = splitter.exec(text); match !== null; match = splitter.exec(text)) {
      const id = this.addedIdArrays.get(match[0]);
      if (id === undefined) continue;
      if (match.index > last) this.pushPiece(ids, text.slice(last, match.index), true);
      ids.add(id);
      last = splitter.lastIndex;
    }
    if (last < text.length) this.pushPiece(ids, last === 0 ? text : text.slice(last), false);
    if (addSpecialTokens) ids.add(this.specialSuffix);
    return ids.join();
  }

  /**
   * A piece between added tokens: cached whole, or, when long, chunk by chunk between words;
   * a chunk the cache does not hold is looked up in finer pieces, so that only what follows
   * the last one another prompt brought is tokenized. A piece between two added tokens (a chat
   * message) is also kept whole: a system prompt comes back as it was, in one lookup.
   */
  private pushPiece(ids: IdParts, text: string, between: boolean): void {
    if (text.length <= FINE_CHARS) return ids.add(this.cachedPiece(text, false));
    this.cuttingText ??= this.textCutsAgree();
    if (!this.cuttingText) return ids.add(this.cachedPiece(text, false));
    const whole = between ? this.cache.get(text) : undefined;
    if (whole !== undefined) {
      this.hits++;
      return ids.add(whole);
    }
    const from = ids.mark;
    this.pushChunks(ids, text);
    if (between) this.cache.set(text, ids.since(from));
  }

  private pushChunks(ids: IdParts, text: string): void {
    forEachChunk(text, CHUNK_CHARS, (start, end) => {
      const chunk = end - start === text.length ? text : text.slice(start, end);
      const cached = this.cache.get(chunk);
      if (cached !== undefined) {
        this.hits++;
        return ids.add(cached);
      }
      const from = ids.mark;
      forEachChunk(chunk, FINE_CHARS, (at, to) => ids.add(this.cachedPiece(to - at === chunk.length ? chunk : chunk.slice(at, to), false)));
      // The whole chunk too, so that the next prompt sharing it takes it in one lookup.
      if (chunk.length > FINE_CHARS) this.cache.set(chunk, ids.since(from));
    });
  }

  private cachedPiece(text: string, addSpecialTokens: boolean): number[] {
    // Whole texts (when not cutting) are keyed with their special-token flag.
    const key = addSpecialTokens ? `\u0001${text}` : text;
    const cached = this.cache.get(key);
    if (cached !== undefined) {
      this.hits++;
      return cached;
    }
    if (this.budget !== Infinity) this.charge(text);
    this.misses++;
    // A piece holds no added token only while cutting at them.
    const ids = this.segmenting && !addSpecialTokens && this.words !== undefined ? this.wordIds(text) : this.encodeWhole(text, addSpecialTokens);
    this.cache.set(key, ids);
    return ids;
  }

  /** Whether the whole-text check of `text` fits in what the request may still spend (then spent). */
  private affords(text: string): boolean {
    if (this.budget === Infinity) return text.length <= this.maxUncachedChars && Buffer.byteLength(text, 'utf8') <= this.maxUncachedChars;
    if (text.length > this.budget) return false;
    const cost = Buffer.byteLength(text, 'utf8');
    if (cost > this.budget) return false;
    this.budget -= cost;
    return true;
  }

  /**
   * Takes what tokenizing `text` costs out of the request's budget: its UTF-8 bytes, which are
   * what byte-level BPE merges (a CJK character is 3 bytes, and cost as much as 3 ASCII ones).
   */
  private charge(text: string): void {
    // A UTF-16 unit is at least one byte: past the budget in units, it is past it in bytes.
    this.spend(text.length > this.budget ? Infinity : Buffer.byteLength(text, 'utf8'));
  }

  private spend(bytes: number): void {
    if (bytes > this.budget) throw OVER_BUDGET;
    this.budget -= bytes;
  }

  private wordIds(text: string): number[] {
    if (!this.wordsChecked) {
      this.wordsChecked = true;
      if (!this.wordsAgree()) {
        this.words = undefined;
        return this.encodeWhole(text, false);
      }
    }
    const ids: number[] = [];
    this.words!.encode(text, ids);
    return ids;
  }

  private stopSegmenting(text: string): void {
    this.segmenting = false;
    this.cache.clear();
    this.words?.clear();
    this.onSegmentMismatch?.(text);
  }

  /** What the post-processor puts around a single sequence (Llama 3's BOS), found on a probe text. */
  private postProcessorTokens(): [number[], number[]] {
    const probe = 'a b';
    const plain = this.encodeWhole(probe, false);
    const full = this.encodeWhole(probe, true);
    for (let at = 0; at + plain.length <= full.length; at++) {
      if (sameIds(full.slice(at, at + plain.length), plain)) return [full.slice(0, at), full.slice(at + plain.length)];
    }
    return [[], []];
  }

  /** Cutting at added tokens gives the whole text's tokens on a sample (template-rendered when there is a template). */
  private cutsAgree(): boolean {
    const samples = [...SAMPLE_TEXTS];
    const rendered = this.chat?.render({ messages: SAMPLE_MESSAGES });
    if (typeof rendered === 'string') samples.push(rendered);
    for (const token of [...this.addedIds.keys()].slice(0, 16)) samples.push(`${token} x${token}\n${token}y ${token}`);
    const agree = samples.every(
      (text) => sameIds(this.encodeCut(text, false), this.encodeWhole(text, false)) && sameIds(this.encodeCut(text, true), this.encodeWhole(text, true)),
    );
    this.cache.clear();
    this.hits = this.misses = 0;
    return agree;
  }

  /** The word cache gives the library's tokens on the samples. */
  private wordsAgree(): boolean {
    const agree = wordsAgreeOn(this.words!, (text) => this.encodeWhole(text, false));
    this.words!.clear();
    return agree;
  }

  /** Cutting at every text cut of the samples, piece by piece, gives the whole text's tokens. */
  private textCutsAgree(): boolean {
    return textCutsAgreeOn((text) => this.encodeWhole(text, false));
  }
}

function isTokenIds(values: unknown[]): values is number[] {
  for (const value of values) if (!Number.isSafeInteger(value) || (value as number) < 0) return false;
  return true;
}
