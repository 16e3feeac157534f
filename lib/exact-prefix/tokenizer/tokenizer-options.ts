/** The options and answers of the prompt tokenizer (tokenizer.ts). */
import type { Refused, RenderRefusal } from './refusals';

/** Options of `PromptTokenizer`. */
export interface PromptTokenizerOptions {
  /** Memory held by the prefix cache (token ids and the text they came from; an eighth of it for the word cache). Default 32 MiB. */
  cacheBytes?: number;
  /** Requests whose cut-and-cached tokenization is compared with whole-text tokenization before it is trusted. Default 32. */
  selfCheckRequests?: number;
  /**
   * The most text a request may bring that is not in the cache yet, counted in UTF-8 bytes (an
   * ASCII character is 1, a CJK one 3: what byte-level BPE works through); a request with more
   * is refused as `too_long`. Tokenizing runs on the event loop (see
   * bench/tokenize.ts and docs/exact-prefix-routing.md for its cost), so this bounds what one
   * request, hostile or not, can cost every other. What was tokenized before the budget ran
   * out stays cached, so a long shared prefix is taken in over a few requests; a single piece
   * of text with no cut in it (between two added tokens, and with no word boundary at least
   * every 256 characters) longer than this never is. The first requests' check against
   * whole-text tokenization is charged to it too, and skipped when it does not fit. Default
   * 32,768: a budget of new CJK text (the costliest per byte) is ~50–70 ms of CPU on a loaded
   * core, within the 100 ms a health check may wait.
   */
  maxUncachedChars?: number;
  /**
   * The most messages a chat request may have; past it the request is refused as `too_long`
   * before its template is rendered. Each message is also charged to `maxUncachedChars` as 16
   * bytes of new text (what its rendering costs). Default 1,024 (about 25–40 ms of rendering;
   * 4,096 took 100 ms).
   */
  maxMessages?: number;
  /** Told once if cutting the text at added tokens changed the tokens (the cache then keeps whole texts only). */
  onSegmentMismatch?: (text: string) => void;
  /**
   * What the vLLM server was started with as `--default-chat-template-kwargs`: template
   * variables under every chat request's own (`chat_template_kwargs`, `reasoning_effort`, ...),
   * e.g. `{ enable_thinking: false }`. Default: none.
   */
  chatTemplateKwargs?: Readonly<Record<string, unknown>>;
}

/** The endpoints whose prompts are tokenized. */
export type PromptKind = 'chat' | 'completions';

/** A request's prompts as token ids (a completions batch has several), or why not. */
export type TokenizeOutcome = { prompts: number[][] } | Refused;

/** Cache counters. */
export interface PromptTokenizerStats {
  /** Requests refused for exact routing, by reason (they are routed on the approximate index). */
  refusals: Readonly<Record<RenderRefusal, number>>;
  hits: number;
  misses: number;
  cachedBytes: number;
  /** False once cutting at added tokens was found to change the tokens. */
  segmenting: boolean;
  /** Whether long pieces are cut between words too (true until the check on samples at the first long piece, or a request, finds it changes the tokens). */
  cuttingText: boolean;
  /** Whether new text goes through the word cache (a byte-level BPE tokenizer; true until the check on samples at its first use finds a difference). */
  wordCache: boolean;
  /** Requests still to be checked against whole-text tokenization (`selfCheckRequests` at first). */
  selfChecksLeft: number;
}
