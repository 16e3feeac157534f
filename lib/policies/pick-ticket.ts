import type { IndexSource } from '../types';

/** The prompt endpoints exact routing tokenizes, as receipts tell them apart in their log lines. */
export type PromptPath = 'chat' | 'completions';

/**
 * What one request's receipts are judged against, made when it was routed: which rank was
 * chosen, on which index, and what the router predicted. One small object per request with a
 * prediction; nothing else of the request is kept.
 */
export class RouteTicket {
  /** Sent as before to an upstream whose receipts are being checked again: it counts toward recovery. */
  probe = false;
  /** Its answer's usage is read (one answer in `usageEvery`, and every probe's). */
  readsUsage = false;
  /** Its 2xx answer began and nothing of it is read: its KV receipt is taken when the response closes, if the answer came whole. */
  atClose = false;
  /** The router asked the stream for its usage: that chunk is taken out of the client's stream. */
  askedUsage = false;
  /** A stream read that nobody asked for its usage: whether it carries one says whether the upstream forces usage. */
  looksForUsage = false;
  /** The upstream's verdict epoch when routed: receipts of an earlier epoch judge nothing. */
  epoch = 0;
  /** How many times the rank's events had stored blocks the index could not key, when routed. */
  orphans = 0;
  /** Who sent the request (lib/verdicts/source.ts): a verdict needs receipts of several. */
  source: string | undefined = undefined;

  constructor(
    readonly upstream: string,
    readonly rank: number,
    readonly index: IndexSource,
    /**
     * `exact`: the prompt tokens the engine should report cached (whole blocks held, the last
     * prompt token never: vLLM's `max_cache_hit_length`); `approximate`: the share of the
     * prompt estimated held (the engine's prompt token count is known only from its answer).
     */
    readonly predicted: number,
    /** `exact`: the prompt's tokens by the router's tokenizer; −1 where they cannot be compared (several prompts). */
    readonly promptTokens: number,
    /** `exact`: whether the chosen rank lacked some of the prompt's blocks (else the receipt is `cached`). */
    readonly stores: boolean,
    /**
     * `exact`: the router key of the prompt's last full block, which whichever rank computes
     * the prompt stores (and announces in its events); `NaN` where there is none to await.
     */
    readonly key: number,
    /** `exact`: another rank of the upstream held the whole prompt at the pick (its events prove nothing). */
    readonly heldElsewhere: boolean,
    readonly path: PromptPath | undefined,
    /** `exact`: the engine's block size (a prediction may be off by one block). */
    readonly blockSize: number,
  ) {}
}

/** An upstream's exact index, as far as receipts read it: which of its ranks hold a block now. */
export interface HeldBlocks {
  heldBy(rank: number, key: number): boolean;
  readonly ranks: readonly number[];
}

/** One exact pick, as exact routing hands it to receipts. */
export interface ExactChoice {
  readonly rank: number;
  readonly path: PromptPath;
  /** The prompt's token count (the first prompt's). */
  readonly tokens: number;
  /** Prompts in the request (a completions batch has several; the engine's usage sums them). */
  readonly prompts: number;
  readonly promptBlocks: number;
  readonly blockSize: number;
  /** Leading blocks the chosen rank holds (speculative entries included). */
  readonly matched: number;
  /** The router key of the prompt's last full block, or `NaN`. */
  readonly lastKey: number;
  /** Whether another rank of the same upstream held the whole prompt. */
  readonly heldElsewhere: boolean;
}

/** What exact routing asks of receipts for one upstream, made when its index starts (and what its index tells). */
export interface ExactGate {
  /** Whether the upstream's ranks are scored on the exact index now (not while its receipts say otherwise, probes aside). */
  readonly exact: boolean;
  /** `rank` stored the block with router key `key` (the events' apply path, once per block). */
  stored(rank: number, key: number): void;
  /** `rank` stored blocks under a parent the index does not know (after a loss cleared it): their keys are not known. */
  orphaned(rank: number): void;
  /** The pick chose a rank of this upstream on the exact index: its ticket. */
  chose(choice: ExactChoice): RouteTicket;
}

/** Receipts as exact routing sees them. */
export interface ExactReceipts {
  /** Starts following an upstream's index (again, after a reconfiguration): its gate. */
  follow(upstream: string, index: HeldBlocks): ExactGate;
}
